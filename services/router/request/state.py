"""One request's state at the router, and the steps every stage of its way shares: the
ids it has at the workers, its deadline, cancelling its current call, and leaving a decode
worker that failed it. ``RequestFlow`` (``flow.py``) is this state with its lifecycle; the
hand-off and the caller's stream take the state, so nothing here imports the flow."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from pdmesh.kv.block_hash import BlockHash
from pdmesh.rpc import messages
from pdmesh.rpc.status import WORKER_FAILED
from pdmesh.sampling_params import SamplingParams
from services.router.policies import Decision
from services.router.request import failover
from services.router.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from services.router.request.mesh import RouterMesh

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestState:
    router: RouterMesh
    request_id: str
    prompt: list[int]
    params: SamplingParams
    """Parsed and validated once, here; workers receive them re-encoded."""
    deadline: float
    """Event-loop time by which the whole request must be done."""
    trace: Any = None
    """The caller's trace context."""
    decode: WorkerHandle | None = None
    prefill: Decision | None = None
    tried: set[str] = field(default_factory=set)
    """Prefill workers that failed this request."""
    call: Any = None
    """The downstream gRPC call in progress (what ``abort`` cancels)."""
    aborted: bool = False
    metadata: Any = None
    streamed_tokens: list[int] = field(default_factory=list)
    """Tokens relayed to the caller so far (what a migration resumes from)."""
    streamed_chars: int = 0
    finished: bool = False
    """A message with a finish reason was relayed: the request is complete."""
    failed_decode: set[str] = field(default_factory=set)
    """Decode workers that failed this request (tried again only when no other is left)."""
    hashes: list[BlockHash] = field(default_factory=list)
    """The prompt's block hashes, computed once in ``run`` for both routing decisions."""
    decode_held: int = 0
    """Prompt tokens the router had sent its decode worker before this request."""
    decode_answered: bool = False
    """A decode worker's stream has sent a message (its reservation is claimed)."""
    prompt_logprobs: list[Any] = field(default_factory=list)
    """The prefill worker's prompt logprobs, for the caller's first message."""
    prompt_logprobs_sent: bool = False
    attempt: int = 0
    """Which attempt at the workers this is: 0 first; a retry before the stream or a
    migration starts the next."""
    outside: dict[str, int] | None = None
    """What the index lookup of the current attempt listed outside the candidates (the
    kvstore tier): sent to the prefill worker (``IndexSeen.outside``)."""

    @property
    def call_id(self) -> str:
        """The request's id at the workers for the current attempt. A worker frees a call
        the router cancelled when it notices the cancel, which a retry sent to the same
        worker can beat: under one id the retry was refused as "already in flight"
        (INVALID_ARGUMENT for the mesh's own retry). The caller only ever sees
        ``request_id``."""
        return self.request_id if not self.attempt else f"{self.request_id}~{self.attempt}"

    @property
    def kv_tokens(self) -> int:
        """The tokens its decode worker's pool must hold: the prompt and every token asked for."""
        return len(self.prompt) + self.params.max_tokens

    def decode_worker(self) -> WorkerHandle:
        if self.decode is None:
            raise RuntimeError(f"{self.request_id}: a stage ran before run() chose the decode worker")
        return self.decode

    def left(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def abort(self) -> bool:
        """Cancel the current downstream call; False when already aborting."""
        if self.aborted:
            return False
        self.aborted = True
        if self.call is not None:
            self.call.cancel()
        return True

    def worker_failed(self, exc: grpc.aio.AioRpcError) -> bool:
        """``exc`` is the worker's failure, not the request's or its caller's (the chaos
        test saw 3 of 6,292 requests fail before a broken prefill or ``Reserve`` call was
        tried again)."""
        return exc.code() in WORKER_FAILED and not self.aborted

    def reserve_msg(self, resume: tuple[list[int], int] | None = None) -> Any:
        return messages.reserve_request(self.call_id, self.prompt, self.params, self.router.cfg.lease_ms, resume)

    def start_call(self, call: Any) -> Any:
        """Make ``call`` the one ``abort`` cancels; refuse to start it once aborted."""
        if self.aborted:
            call.cancel()
            raise asyncio.CancelledError
        self.call = call
        return call

    def leave_decode(self, exc: grpc.aio.AioRpcError, stage: str) -> None:
        """Leave the decode worker that failed this request for the one ``failover`` chooses.
        Only a call that found it unreachable marks it down at once; a failed KV write or a
        broken call may be this request's own, so the registry asks the worker for its Info
        instead (``Registry.call_failed``): marked down, the only decode worker refused every
        request routed until its next Info, and one failure became many."""
        failed = self.decode_worker()
        self.router.workers.call_failed(failed, exc)
        self.failed_decode.add(failed.worker_id)
        worker, held = failover.replacement(self.router, failed, exc, stage, self.hashes, self.failed_decode,
                                            self.kv_tokens, self.decode_held)
        if worker is not failed:
            failed.release()
            self.decode, self.decode_held = worker, held
            worker.acquire()
        log.warning("decode worker %s failed %s (%s) for %s after %d tokens; continuing on %s", failed.worker_id,
                    stage, exc.code().name, self.request_id, len(self.streamed_tokens), worker.worker_id)
