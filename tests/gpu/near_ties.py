"""Tie-aware greedy comparison for half precision, where two correct kernels may round a
near-tie of the logits differently and then continue different, equally valid, texts.

Greedy tokens are compared position by position; at the first position where they differ,
the token the candidate chose must be a near-tie of the reference's choice in the
reference's own log-probabilities (logit differences equal log-prob differences), and
the comparison of that sequence ends there. A kernel with a real error diverges where the
reference's top token leads by far more than rounding, and fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NEAR_TIE = 0.1
"""Largest log-prob lead of the reference's token over the candidate's that counts as a
tie in bf16: bf16 keeps 8 significant bits (~0.4% per rounding), so logits of a few units
land on a grid of 1/64-1/128. On an H200 the largest lead at any divergence of the GPU
tests was 0.0156 (docs/performance/log.md section 48); a real error leads by far more."""


@dataclass
class Agreement:
    compared: int = 0
    """Positions compared (up to and including each sequence's first divergence)."""
    matched: int = 0
    divergences: list[tuple[int, int, float]] | None = None
    """(sequence, position, the reference token's lead) at each first divergence."""


def compare(got: Sequence[Sequence[int]], want: Sequence[Sequence[int]],
            want_top: Sequence[Sequence[dict[int, float]]], tol: float = NEAR_TIE) -> Agreement:
    """Check every sequence of ``got`` against ``want`` (with the reference's top
    log-probs per position) and raise AssertionError on a divergence that is no near-tie.
    ``got`` may run past ``want`` (a reference that stopped at EOS), never end before it."""
    agreement = Agreement(divergences=[])
    for i, (g, w, top) in enumerate(zip(got, want, want_top, strict=True)):
        for pos, (a, b) in enumerate(zip(g, w)):
            agreement.compared += 1
            if a == b:
                agreement.matched += 1
                continue
            lead = top[pos][b] - top[pos].get(a, float("-inf"))
            assert lead <= tol, (
                f"sequence {i} diverges at position {pos}: got token {a}, the reference chose {b} "
                f"with a lead of {lead:.4f} in log-prob (a near-tie is <= {tol})")
            agreement.divergences.append((i, pos, lead))  # type: ignore[union-attr]
            break
        else:
            assert len(g) >= len(w), f"sequence {i}: {len(g)} tokens against the reference's {len(w)}"
    return agreement
