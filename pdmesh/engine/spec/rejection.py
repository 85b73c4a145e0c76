"""Which draft tokens the target keeps.

Greedy: the longest prefix of drafts equal to the target's own argmax at each position,
then the target's token at the first mismatch (or after the last draft). Output equals
one-token-per-step greedy decoding by construction.

Sampling (Leviathan et al., Chen et al.): draft ``d`` drawn from ``q`` is kept with
probability ``min(1, p(d) / q(d))``; on rejection the token comes from
``normalize(max(0, p - q))`` and the run ends; if every draft is kept a bonus token comes
from ``p`` at the next position. Every emitted token is then distributed exactly as ``p``.
Deterministic drafts (n-gram lookup, greedy drafts) are ``q = one_hot(d)``. ``p`` and
``q`` are the processed distributions (penalties, temperature, top-k / top-p / min-p).
"""

from __future__ import annotations

from typing import Any

import torch

from pdmesh.engine.sampler import draw


def accept_greedy(drafts: list[int], targets: list[int]) -> list[int]:
    """``targets[i]`` is the target's argmax after drafts ``0..i-1``; ``len(drafts) + 1`` of them."""
    out: list[int] = []
    for draft, target in zip(drafts, targets):
        if draft != target:
            break
        out.append(draft)
    out.append(targets[len(out)])
    return out


def accept_sampled(
    p: torch.Tensor, drafts: list[int], q: torch.Tensor | None, generator: Any
) -> list[int]:
    """``p``: [k + 1, vocab] target probabilities; ``q``: [k, vocab] draft probabilities, or
    None for deterministic drafts. Draws come from ``generator`` when the request is seeded."""
    out: list[int] = []
    for i, draft in enumerate(drafts):
        p_d = float(p[i, draft])
        q_d = float(q[i, draft]) if q is not None else 1.0
        u = float(torch.rand((), generator=generator, device=p.device))
        if q_d > 0 and u * q_d < p_d:
            out.append(draft)
            continue
        if q is not None:
            residual = (p[i] - q[i]).clamp_min_(0)
        else:
            residual = p[i].clone()
            residual[draft] = 0
        if float(residual.sum()) <= 0:  # p == q to rounding: p itself is the residual
            residual = p[i]
        out.append(int(draw(residual[None], [generator])[0]))
        return out
    out.append(int(draw(p[len(drafts)][None], [generator])[0]))
    return out
