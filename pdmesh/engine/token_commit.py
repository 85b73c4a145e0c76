"""What a step sampled, appended to its sequences: each token with its logprob, the stop
checks, a finished sequence's blocks freed (or held for a hand-off), and the accepted part of
a speculative draft kept. The engine's step calls it under its lock, once per sequence."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pdmesh.engine.output import RequestState
from pdmesh.engine.scheduler import Scheduler
from pdmesh.engine.spec.speculator import Verified
from pdmesh.engine.stopping import finish_status
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.request import SeqStatus, Sequence


@dataclass(eq=False)
class TokenCommit:
    requests: dict[str, RequestState]
    """The engine's live requests, by id (shared, not copied)."""
    scheduler: Scheduler
    kv: KVCacheManager
    eos_token_ids: frozenset[int]
    max_model_len: int
    generated_tokens: int = 0
    """Tokens sampled and kept since start (the workers' periodic stats line)."""

    def commit(self, seq: Sequence, verified: Verified) -> None:
        """Append the step's tokens up to the first that ends the sequence; keep the KV of
        accepted drafts and free the slots of rejected ones."""
        start = seq.num_tokens - 1
        for token, lp in zip(verified.tokens, verified.logprobs):
            self.append(seq, token, lp)
            if seq.status.finished:
                break
        if verified.num_drafts:
            m = self.requests[seq.request_id].metrics
            m.spec_draft_tokens += verified.num_drafts
            m.spec_accepted_tokens += verified.num_accepted
            m.spec_steps += 1
            if not seq.status.finished:
                seq.num_computed_tokens = start + 1 + verified.num_accepted
                self.kv.trim(seq, seq.num_computed_tokens)

    def append(self, seq: Sequence, token: int, lp: Any) -> None:
        state = self.requests[seq.request_id]
        p = seq.params
        seq.token_ids.append(token)
        self.generated_tokens += 1
        if lp is not None:
            seq.logprobs.append(lp)
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = time.monotonic()
            state.metrics.num_cached_tokens = seq.num_cached_tokens
        stop_str = state.detoks[seq.index].add(token, seq.num_output_tokens >= p.min_tokens)
        status = finish_status(seq, token, stop_str, self.eos_token_ids, self.max_model_len)
        if status is not None:
            self.scheduler.finish(seq, status, free=not state.hold_kv)
            if state.hold_kv:
                seq.status = SeqStatus.FINISHED_KV_HELD
            if state.finished:
                state.metrics.finished_time = time.monotonic()
