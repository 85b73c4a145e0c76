"""Rejection sampling keeps the target distribution, whatever the draft proposes."""

from __future__ import annotations

import pytest
import torch

from pdmesh.engine.spec.rejection import accept_greedy, accept_sampled

# Chi-square critical value for 4 degrees of freedom at significance 0.001: a correct
# sampler fails this test once in a thousand seeds, and these seeds are fixed.
CHI2_DF4_P001 = 18.47
N = 20_000


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


P = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05],
                  [0.05, 0.10, 0.15, 0.20, 0.50],
                  [0.20, 0.20, 0.20, 0.20, 0.20]])
Q = torch.tensor([[0.10, 0.10, 0.10, 0.10, 0.60],
                  [0.40, 0.30, 0.10, 0.10, 0.10]])


def _emitted(q: torch.Tensor | None, draft_of: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first emitted token, and of the second when the first was accepted."""
    gen = torch.Generator().manual_seed(1234)
    first = torch.zeros(5)
    second = torch.zeros(5)
    for _ in range(N):
        drafts = draft_of(gen)
        out = accept_sampled(P, drafts, q, gen)
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second


def test_draft_model_drafts_keep_the_target_distribution() -> None:
    def draw(gen: torch.Generator) -> list[int]:
        return [int(torch.multinomial(Q[i], 1, generator=gen)) for i in range(2)]

    first, second = _emitted(Q, draw)
    assert chi2(first, P[0]) < CHI2_DF4_P001
    assert chi2(second, P[1]) < CHI2_DF4_P001


def test_deterministic_drafts_keep_the_target_distribution() -> None:
    # n-gram drafts are fixed tokens (q is one-hot): a likely one and an unlikely one.
    first, second = _emitted(None, lambda gen: [0, 1])
    assert chi2(first, P[0]) < CHI2_DF4_P001
    assert chi2(second, P[1]) < CHI2_DF4_P001


def test_a_draft_equal_to_the_target_is_always_accepted() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        drafts = [int(torch.multinomial(P[i], 1, generator=gen)) for i in range(2)]
        out = accept_sampled(P, drafts, P[:2].clone(), gen)
        assert out[:2] == drafts and len(out) == 3


def test_a_draft_the_target_cannot_produce_is_never_accepted() -> None:
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5])
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        out = accept_sampled(p, [0], None, gen)
        assert len(out) == 1 and out[0] in (1, 2)


@pytest.mark.parametrize(
    ("drafts", "targets", "expected"),
    [([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8]),  # all accepted + the bonus token
     ([5, 6, 7], [5, 9, 7, 8], [5, 9]),  # first mismatch: the target's token ends the run
     ([5], [4, 1], [4])],
)
def test_greedy_keeps_the_matching_prefix_and_the_targets_next_token(
    drafts: list[int], targets: list[int], expected: list[int]
) -> None:
    assert accept_greedy(drafts, targets) == expected
