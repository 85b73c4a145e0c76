"""KV hand-off between workers: what the engine does for disaggregated prefill and decode.

Decode side: ``reserve`` allocates blocks for a prompt whose KV will be written by a
prefill worker (prefix-cache hits on this worker are kept and not transferred again), the
sequence waits outside the scheduler, then ``commit`` adds the first token and lets it run;
``release`` frees a reservation that will never be committed (lease expired, prefill failed).

Prefill side: a request added with ``hold_kv=True`` keeps its blocks when it finishes
(``held_block_ids``) until ``release`` after its KV has been written out.

Both sides free through ``KVCacheManager.free``; nothing here can leave a block owned by a
request the engine no longer tracks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdmesh.errors import CapacityError, UnknownRequestError
from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.free_queue import KVBlock
from pdmesh.request import Sequence, TokenLogprob
from pdmesh.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdmesh.engine.llm_engine import LLMEngine


@dataclass(frozen=True, slots=True)
class Reservation:
    """Destination blocks for a prompt's KV on a decode worker."""

    block_ids: list[int]
    """Blocks to be written, for prompt blocks ``first_block`` onward."""
    first_block: int
    cached_tokens: int
    """Prompt tokens this worker already holds (``first_block * block_size``)."""


class KVHandoff:
    """The engine's reservation and hold bookkeeping (state lives here, blocks in the pool)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.reserved: dict[str, Sequence] = {}
        self.held: dict[str, Sequence] = {}
        self._progress: dict[str, int] = {}
        """hold_kv requests whose count of fully computed prompt blocks grew this step."""

    # -- decode side ------------------------------------------------------------------
    def reserve(self, request_id: str, prompt: list[int], params: SamplingParams) -> Reservation:
        eng = self.engine
        state = eng._admit_state(request_id, prompt, params)
        seq = state.seqs[0]
        hits = eng.kv.get_computed_blocks(seq)
        bs = eng.kv.block_size
        if not eng.kv.allocate_slots(seq, seq.num_tokens - len(hits) * bs, hits):
            del eng._requests[request_id]
            raise CapacityError(
                f"decode worker has {eng.pool.num_free_blocks} free KV blocks; the prompt needs "
                f"{-(-seq.num_tokens // bs) - len(hits)}"
            )
        seq.num_cached_tokens = len(hits) * bs
        self.reserved[request_id] = seq
        return Reservation(eng.kv.block_ids(seq)[len(hits) :], len(hits), len(hits) * bs)

    def commit(self, request_id: str, first_token: int, logprob: TokenLogprob | None,
               cached_tokens: int) -> None:
        """The prompt's KV has arrived: append the first token and start decoding."""
        seq = self.reserved.pop(request_id, None)
        if seq is None:
            raise UnknownRequestError(request_id)
        eng = self.engine
        seq.num_computed_tokens = seq.prompt_len
        seq.num_cached_tokens = max(seq.num_cached_tokens, cached_tokens)
        eng.kv.cache_blocks(seq)
        if seq.generator is not None and not seq.params.greedy:
            # The prefill worker drew the first token from this seed: consume the same
            # draw so the rest matches an in-process run token for token.
            import torch

            torch.empty(eng.model_config.vocab_size, device=eng.config.device).exponential_(
                generator=seq.generator
            )
        eng.scheduler.add_running(seq)
        state = eng._requests[request_id]
        state.metrics.first_scheduled_time = time.monotonic()
        eng._append(seq, first_token, logprob)
        eng._to_render[request_id] = state

    # -- prefill side -----------------------------------------------------------------
    def note_progress(self, seq: Sequence) -> None:
        """Record how many full prompt blocks of a held-KV request are computed (after a step)."""
        bs = self.engine.kv.block_size
        self._progress[seq.request_id] = min(seq.num_computed_tokens, seq.prompt_len) // bs

    def take_progress(self) -> dict[str, int]:
        """``{request id: full prompt blocks computed}`` for requests that ran since the last call;
        lets a prefill worker send finished blocks while later chunks still compute."""
        progress, self._progress = self._progress, {}
        return progress

    def hold(self, seq: Sequence) -> None:
        self.held[seq.request_id] = seq

    def held_block_ids(self, request_id: str) -> list[int]:
        seq = self.held.get(request_id)
        if seq is None:
            raise UnknownRequestError(request_id)
        return self.engine.kv.block_ids(seq)

    def offload_plan(self, request_id: str) -> tuple[list[bytes], list[int]]:
        """Hashes and block ids of the held prompt's full blocks (for the kvstore)."""
        seq = self.held.get(request_id)
        if seq is None:
            raise UnknownRequestError(request_id)
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
        """Free a reservation or held blocks; False when there was neither."""
        seq = self.reserved.pop(request_id, None) or self.held.pop(request_id, None)
        if seq is None:
            return False
        self.engine.kv.free(seq)
        self.engine._requests.pop(request_id, None)
        return True

