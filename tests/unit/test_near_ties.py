"""The GPU tests' tie-aware comparison (tests/gpu/near_ties.py) fails where it must."""

from __future__ import annotations

import pytest

from tests.gpu.near_ties import compare


def test_identical_sequences_agree_fully() -> None:
    a = compare([[1, 2, 3]], [[1, 2, 3]], [[{1: 0.0}, {2: 0.0}, {3: 0.0}]])
    assert (a.compared, a.matched, a.divergences) == (3, 3, [])


def test_a_divergence_at_a_near_tie_ends_that_sequence() -> None:
    top = [[{1: -0.5}, {2: -0.70, 9: -0.75}, {3: -0.1}]]
    a = compare([[1, 9, 4]], [[1, 2, 3]], top)
    assert a.matched == 1 and a.compared == 2 and a.divergences == [(0, 1, pytest.approx(0.05))]


def test_a_divergence_far_from_a_tie_fails() -> None:
    top = [[{1: -0.5}, {2: -0.2, 9: -3.0}]]
    with pytest.raises(AssertionError, match="lead of 2.8000"):
        compare([[1, 9]], [[1, 2]], top)


def test_a_token_outside_the_reference_top_fails() -> None:
    with pytest.raises(AssertionError, match="lead of inf"):
        compare([[7]], [[1]], [[{1: -0.1, 2: -0.2}]])
