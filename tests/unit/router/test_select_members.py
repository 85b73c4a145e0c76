"""Which index members a decision weighs when a prefix has many holders."""

from __future__ import annotations

import random

from services.router.prefill_routing import select_members


def test_the_deepest_holders_and_every_tier_member_are_kept_and_the_rest_sampled() -> None:
    shallow = [f"p{i}|e" for i in range(100)] + ["kvstore-0|k"]
    groups = [(70, ["deep-a|e", "deep-b|e"]), (64, shallow), (3, ["p999|e", "kvstore-1|k"])]
    found = select_members(groups, 10, random.Random(0))
    assert found[("deep-a", "e")] == 70 and found[("deep-b", "e")] == 70
    assert found[("kvstore-0", "k")] == 64 and found[("kvstore-1", "k")] == 3  # past the limit: kept
    assert ("p999", "e") not in found  # past the limit
    sampled = [k for k, depth in found.items() if depth == 64 and not k[0].startswith("kvstore")]
    assert 7 <= len(sampled) <= 8  # the limit's 8 left, less the tier member if it was drawn
    # Under the limit, everyone.
    assert len(select_members(groups, 200, random.Random(0))) == 105


def test_the_sample_changes_between_decisions() -> None:
    groups = [(64, [f"p{i}|e" for i in range(1000)])]
    rng = random.Random(1)
    first, second = select_members(groups, 32, rng), select_members(groups, 32, rng)
    assert len(first) == len(second) == 32 and first != second
