"""``n > 1``: when the first sequence's prompt is done, its siblings fork from it.

They share the prompt's blocks (copy-on-write) and sample their first token from the
parent's logits row: ``fork_siblings`` makes them, ``expand_forks`` lays the step's logits
rows out accordingly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pdmesh.engine.model_runner import StepResult
from pdmesh.engine.output import RequestState
from pdmesh.engine.scheduler import Scheduler
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.request import Sequence
from pdmesh.tokenizer import Tokenizer


def fork_siblings(state: RequestState, parent: Sequence, tokenizer: Tokenizer, device: str,
                  kv: KVCacheManager, scheduler: Scheduler) -> list[Sequence]:
    """The siblings of an n > 1 request whose prompt just finished, sharing its blocks,
    scheduled as running."""
    children = []
    for _ in range(1, state.params.n):
        child = state.new_sequence(tokenizer, device, list(parent.token_ids))
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        kv.fork(parent, child)
        scheduler.add_running(child)
        children.append(child)
    return children


def expand_forks(
    result: StepResult, fork: Callable[[Sequence], list[Sequence]]
) -> tuple[torch.Tensor | None, list[Sequence], list[list[int]]]:
    """Sequences to sample, their drafts and the logits rows for them in order (None: the
    rows as they are). ``fork(parent)`` creates and schedules the parent's siblings."""
    if not any(s.fork_pending for s in result.sampling):
        return None, result.sampling, result.drafts
    rows: list[int] = []
    seqs: list[Sequence] = []
    drafts: list[list[int]] = []
    row = 0
    for seq, spec in zip(result.sampling, result.drafts):
        span = list(range(row, row + len(spec) + 1))
        row += len(span)
        rows.extend(span)
        seqs.append(seq)
        drafts.append(spec)
        if seq.fork_pending:
            seq.fork_pending = False
            for child in fork(seq):
                rows.extend(span)
                seqs.append(child)
                drafts.append([])
    return torch.tensor(rows), seqs, drafts
