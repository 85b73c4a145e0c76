"""``AsyncLLMEngine``: many concurrent ``generate`` streams over one engine loop.

The engine steps in a thread of its own, back to back, and hands each step's outputs to
the event loop (``call_soon_threadsafe``); it never waits for the loop. So the work the
loop does per token (detokenized outputs to protobuf, gRPC or HTTP writes) overlaps the
next forward pass instead of sitting between two steps — measured, that gap left a core
idle on a 2-core worker (docs/performance/log.md). torch releases the GIL in its kernels, so
the two threads share the machine.

Coroutines add requests and do hand-off bookkeeping directly under the engine's lock,
which a step does not hold during its forward pass; aborts are applied by the engine
thread between steps, since they free blocks a step may be writing. Closing a
``generate`` iterator (client gone, task cancelled) aborts the request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from pdmesh.engine.core_share import CoreShare
from pdmesh.engine.faults import StepStall
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.resume import Resume
from pdmesh.errors import InvalidRequestError, UnknownRequestError
from pdmesh.request import RequestOutput
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry.thread_name import name_os_thread

log = logging.getLogger(__name__)
LEND_AFTER_IDLE_S = 0.1
"""An engine lends its cores only after this long without work: lent across the short gaps
of a stream of small requests, they came back only after the borrower's step, and the
overlapping threads slowed every worker (3,000 tiny requests at once on 2 cores: 756-1,127
completed against 1,672-1,926 with fixed shares)."""


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._pending_aborts: list[str] = []
        self._aborts_lock = threading.Lock()
        """Aborts come from the loop (and a failing step), the engine thread applies them."""
        self._work = threading.Event()
        """Set when there may be something to do: a request added, an abort, a shutdown."""
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._progress_listeners: dict[str, tuple[Callable[[int], None], int]] = {}
        """request id -> (listener, full prompt blocks it was last told)."""
        self.core_share: CoreShare | None = None
        """Cores borrowed from idle workers on this machine for each step (and lent while
        idle); None: the thread count is fixed."""

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | Mapping[str, Any] | None = None,
        request_id: str | None = None,
        hold_kv: bool = False,
        resume: Resume | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream this request's outputs (deltas by default) until it finishes."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.from_dict(dict(params or {"output_kind": "delta"}))
        rid = request_id or f"async-{next(self._ids)}"
        checked = params
        await self.prepare(checked)

        def start() -> None:
            self.engine.add_request(rid, prompt, checked, hold_kv=hold_kv, resume=resume)

        async for out in self.stream(rid, start):
            yield out

    async def prepare(self, params: SamplingParams) -> None:
        """Compile the request's grammar (structured output) in an executor thread before
        the request reaches the engine, whose step thread then only copies it; raises
        ``InvalidRequestError`` when it does not compile."""
        if params.structured_output is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, self.engine.grammars.compile, params.structured_output)

    async def stream(self, rid: str, start: Callable[[], None]) -> AsyncIterator[RequestOutput]:
        """Run ``start`` (it must put ``rid`` in the engine), then stream ``rid``'s outputs.

        An error from ``start`` (validation, capacity) is raised here, before anything is
        streamed. Leaving early aborts the request and frees its blocks.
        """
        if rid in self._queues:
            raise InvalidRequestError("request_id", f"{rid!r} is already in flight")
        self._ensure_thread()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[rid] = queue
        try:
            self.call(start)
        except BaseException:
            del self._queues[rid]
            raise
        self._dispatch(self.call(self.engine.take_ready_outputs))
        self._work.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.abort(rid)

    def watch_progress(self, rid: str, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(full_prompt_blocks)`` (on the event loop) after each step that
        completed more of ``rid``'s prompt blocks; None stops watching."""
        if listener is None:
            self._progress_listeners.pop(rid, None)
        else:
            self._progress_listeners[rid] = (listener, 0)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine now, under its lock (not held during forward passes).

        For bookkeeping only (add, reserve, commit, release, Info): it must not free blocks
        a running step may write, which is why aborts go through ``abort`` instead.
        """
        with self.engine.lock:
            return fn()

    def abort(self, request_id: str) -> None:
        """Abort between steps (the step in flight may be writing the request's blocks)."""
        with self._aborts_lock:
            self._pending_aborts.append(request_id)
        self._work.set()

    # -- the engine thread ------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._loop = asyncio.get_running_loop()
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="pdmesh-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        name_os_thread("pdmesh-engine")  # its OpenMP pool inherits the name
        eng = self.engine
        stall = StepStall.from_env()
        while not self._stopping:
            self._apply_aborts()
            if not eng.has_unfinished_requests():  # a step would render these itself
                self._post(self._dispatch, self.call(eng.take_ready_outputs))
                if self.core_share is None or not self._work.wait(LEND_AFTER_IDLE_S):
                    if self.core_share is not None:
                        self.core_share.idle()  # idle for a while: lend our cores
                    self._work.wait()
                self._work.clear()
                continue
            prompt_budget = None
            if self.core_share is not None:
                prompt_budget = self.core_share.prompt_budget(self.core_share.busy(),
                                                              eng.config.scheduler.max_num_batched_tokens)
            try:
                outputs = eng.step(prompt_budget)
            except Exception as exc:  # a broken step fails every stream, never hangs them
                if self.core_share is not None:
                    self.core_share.step_done()
                log.exception("engine step failed; failing the requests in flight")
                self._post(self._fail_all, exc)
                self._work.wait(0.1)
                self._work.clear()
                continue
            if self.core_share is not None:
                self.core_share.step_done()
            progress = self._progress() if self._progress_listeners else []
            self._post(self._deliver, outputs, progress)
            if stall is not None:
                stall.step_done()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _progress(self) -> list[tuple[str, int]]:
        progress = self.engine.handoff.prefill_progress
        with self.engine.lock:
            return [(rid, progress(rid)) for rid in list(self._progress_listeners)]

    def _apply_aborts(self) -> None:
        with self._aborts_lock:
            aborts, self._pending_aborts = self._pending_aborts, []
        for rid in aborts:
            try:
                with self.engine.lock:
                    self.engine.abort_request(rid)
            except UnknownRequestError:
                pass  # already finished or released

    # -- on the event loop ------------------------------------------------------------
    def _deliver(self, outputs: list[RequestOutput], progress: list[tuple[str, int]]) -> None:
        """Outputs first: their streams' tasks wake before the progress listeners', so a
        prompt's first token is answered before a listener writes its last blocks out
        (a prefill worker's KV write, ~1 ms of the loop's time per 256 tokens)."""
        self._dispatch(outputs)
        for rid, blocks in progress:
            entry = self._progress_listeners.get(rid)
            if entry is not None and blocks > entry[1]:
                self._progress_listeners[rid] = (entry[0], blocks)
                entry[0](blocks)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def _fail_all(self, exc: BaseException) -> None:
        for rid, queue in list(self._queues.items()):
            queue.put_nowait(exc)
            self.abort(rid)

    async def shutdown(self) -> None:
        self._stopping = True
        self._work.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)
        if self.core_share is not None and (thread is None or not thread.is_alive()):
            self.core_share.close()  # a stopped worker's cores are its peers' from now on
            self.core_share = None
