"""KV hand-off between workers: what the engine does for disaggregated prefill and decode.

Decode side: ``reserve`` allocates blocks for a prompt whose KV a prefill worker will
write (prefix-cache hits on this worker are kept and not transferred again); the sequence
is WAITING_FOR_REMOTE_KV, outside the scheduler. ``commit`` appends the first token and
lets it run; ``release`` frees a reservation that will never be committed (lease expired,
prefill failed).

Prefill side: a request added with ``hold_kv=True`` ends FINISHED_KV_HELD, keeping its
blocks (``held_block_ids``) until ``release`` after its KV has been written out.

The state is the sequence's status; the blocks are the pool's. Everything here goes
through ``LLMEngine``'s public methods and ``KVCacheManager.free``, so nothing can leave a
block owned by a request the engine no longer tracks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pdmesh.engine.sampler import seeded_uniform
from pdmesh.errors import CapacityError, UnknownRequestError
from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.free_queue import KVBlock
from pdmesh.request import SeqStatus, Sequence, TokenLogprob
from pdmesh.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdmesh.config import EngineConfig
    from pdmesh.engine.output import RequestState
    from pdmesh.kv.block_pool import BlockPool
    from pdmesh.kv.kv_cache_manager import KVCacheManager


class HandoffEngine(Protocol):
    """What the hand-off builds on of ``LLMEngine`` (its section "what the hand-off builds
    on"), so that the engine, which owns a ``KVHandoff``, is not imported back."""

    config: EngineConfig
    pool: BlockPool
    kv: KVCacheManager

    def admit(self, request_id: str, prompt: list[int], params: SamplingParams) -> RequestState: ...

    def start_running(self, seq: Sequence, first_token: int, logprob: TokenLogprob | None) -> None: ...

    def first_seq(self, request_id: str) -> Sequence: ...

    def handoff_seqs(self) -> list[Sequence]: ...

    def forget(self, request_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Reservation:
    """Destination blocks for a prompt's KV on a decode worker."""

    block_ids: list[int]
    """Blocks to be written, for prompt blocks ``first_block`` onward."""
    first_block: int
    cached_tokens: int
    """Prompt tokens this worker already holds (``first_block * block_size``)."""


class KVHandoff:
    """Reserve / commit / hold / release, over sequences in the hand-off states."""

    def __init__(self, engine: HandoffEngine) -> None:
        self.engine = engine

    def _seq_in(self, request_id: str, *states: SeqStatus) -> Sequence:
        try:
            seq = self.engine.first_seq(request_id)
        except UnknownRequestError:
            raise UnknownRequestError(request_id) from None
        if seq.status not in states:
            raise UnknownRequestError(request_id)
        return seq

    @property
    def count(self) -> int:
        """Reservations awaiting KV plus KV held for a write."""
        return len(self.engine.handoff_seqs())

    # -- decode side ------------------------------------------------------------------
    def reserve(self, request_id: str, prompt: list[int], params: SamplingParams) -> Reservation:
        eng = self.engine
        seq = eng.admit(request_id, prompt, params).seqs[0]
        hits = eng.kv.get_computed_blocks(seq)
        bs = eng.kv.block_size
        if not eng.kv.allocate_slots(seq, seq.num_tokens - len(hits) * bs, hits):
            eng.forget(request_id)
            raise CapacityError(
                f"decode worker has {eng.pool.num_free_blocks} free KV blocks; the prompt needs "
                f"{-(-seq.num_tokens // bs) - len(hits)}"
            )
        seq.num_cached_tokens = len(hits) * bs
        seq.status = SeqStatus.WAITING_FOR_REMOTE_KV
        return Reservation(eng.kv.block_ids(seq)[len(hits) :], len(hits), len(hits) * bs)

    def commit(self, request_id: str, first_token: int, logprob: TokenLogprob | None,
               cached_tokens: int) -> None:
        """The prompt's KV has arrived: append the first token and start decoding."""
        seq = self._seq_in(request_id, SeqStatus.WAITING_FOR_REMOTE_KV)
        eng = self.engine
        seq.num_computed_tokens = seq.prompt_len
        seq.num_cached_tokens = max(seq.num_cached_tokens, cached_tokens)
        eng.kv.cache_blocks(seq)
        if seq.generator is not None and not seq.params.greedy:
            # The prefill worker drew the first token from this seed: consume the same
            # draw so the rest matches an in-process run token for token.
            seeded_uniform(seq.generator, eng.config.device)
        eng.start_running(seq, first_token, logprob)

    # -- prefill side -----------------------------------------------------------------
    def prefill_progress(self, request_id: str) -> int:
        """Full prompt blocks computed so far (a prefill worker sends those early)."""
        try:
            seq = self.engine.first_seq(request_id)
        except UnknownRequestError:
            return 0
        return min(seq.num_computed_tokens, seq.prompt_len) // self.engine.kv.block_size

    def held_block_ids(self, request_id: str) -> list[int]:
        return self.engine.kv.block_ids(self._seq_in(request_id, SeqStatus.FINISHED_KV_HELD))

    def offload_plan(self, request_id: str) -> tuple[list[bytes], list[int]]:
        """Hashes and block ids of the held prompt's full blocks (for the kvstore)."""
        seq = self._seq_in(request_id, SeqStatus.FINISHED_KV_HELD)
        n = seq.prompt_len // self.engine.kv.block_size
        self.engine.kv.ensure_hashes(seq, n)
        return list(seq.block_hashes[:n]), self.engine.kv.block_ids(seq)[:n]

    # -- importing blocks from the kvstore --------------------------------------------
    def import_start(self, n: int) -> list[KVBlock] | None:
        """Take ``n`` blocks to read fetched KV into (None when the pool has no room)."""
        return self.engine.pool.get_new_blocks(n)

    def import_finish(self, blocks: list[KVBlock], hashes: list[BlockHash],
                      token_chunks: list[list[int]], parent: BlockHash | None, ok: bool) -> None:
        """Register fetched blocks as prefix cache (if the read succeeded) and free them."""
        if ok:
            self.engine.pool.cache_blocks(blocks, hashes, token_chunks, parent)
        self.engine.pool.free_blocks(reversed(blocks))

    # -- both -------------------------------------------------------------------------
    def release(self, request_id: str) -> bool:
        """Free a reservation or held blocks; False when the request is in neither state."""
        try:
            seq = self._seq_in(request_id, SeqStatus.WAITING_FOR_REMOTE_KV, SeqStatus.FINISHED_KV_HELD)
        except UnknownRequestError:
            return False
        if seq.status is SeqStatus.WAITING_FOR_REMOTE_KV:
            seq.set_finished(SeqStatus.FINISHED_ABORTED)
        self.engine.kv.free(seq)
        self.engine.forget(request_id)
        return True
