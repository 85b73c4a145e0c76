"""The grammar's token mask on the rows of a batch that have one.

Only constrained rows are touched: an unconstrained row costs one attribute read per step.
For the constrained ones each matcher writes a bitmask (one bit per token) into one int32
tensor, which is expanded to a boolean mask and applied to those rows' logits at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pdmesh.structured.grammars import Grammars, TokenGrammar

_SHIFTS = torch.arange(32, dtype=torch.int32)


def constrained_rows(rows: Sequence[Any]) -> list[int]:
    return [i for i, r in enumerate(rows) if r.params.structured_output is not None]


def grammar_of(row: Any, grammars: Grammars) -> tuple[TokenGrammar, list[int]]:
    """A row's grammar state, caught up with its committed tokens, and the draft tokens it
    stands after (a ``RowView`` in speculative verification; none for a sequence)."""
    seq = getattr(row, "seq", row)
    if seq.grammar is None:
        seq.grammar = grammars.matcher(seq.params.structured_output)
    seq.grammar.catch_up(seq.output_token_ids)
    return seq.grammar, list(getattr(row, "extra", ()))


def apply_grammar_masks(logits: torch.Tensor, rows: Sequence[Any], grammars: Grammars) -> None:
    """Set the logits of tokens a row's grammar forbids to -inf, in place. A row left with
    nothing allowed (its grammar is complete and ``min_tokens`` holds EOS back, or its
    tokens left the grammar) may only end: its EOS tokens are allowed.

    The mask goes on as an added bias of 0 or -inf, not ``masked_fill``: on this CPU build
    a boolean fill over 16 random rows of 8,192 took 0.30-0.38 ms against 0.07 ms for the
    bias (docs/structured-outputs.md)."""
    idx = constrained_rows(rows)
    if not idx:
        return
    vocab = logits.shape[-1]
    bits = torch.empty(len(idx), (vocab + 31) // 32, dtype=torch.int32)
    for j, i in enumerate(idx):
        state, drafts = grammar_of(rows[i], grammars)
        state.fill_mask(bits[j], drafts)
    allowed = ((bits[:, :, None] >> _SHIFTS) & 1).reshape(len(idx), -1)[:, :vocab].to(logits.dtype)
    # (allowed - 1) * inf: -inf where forbidden, NaN (0 * inf) where allowed, made 0.
    bias = allowed.sub_(1).mul_(float("inf")).nan_to_num_(nan=0.0, neginf=float("-inf"))
    dead = ~(bits != 0).any(dim=1)
    if bool(dead.any()) and grammars.eos_token_ids:
        bias[dead.nonzero().flatten()[:, None], torch.tensor(grammars.eos_token_ids)[None, :]] = 0.0
    at = torch.tensor(idx, device=logits.device)
    logits.index_copy_(0, at, logits.index_select(0, at).add_(bias.to(logits.device)))
