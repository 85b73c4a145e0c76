"""The per-sequence controller: k follows acceptance, and a sequence that keeps missing backs off."""

from __future__ import annotations

from pdmesh.engine.spec.speculator import MAX_BACKOFF, _Adaptive


def test_k_grows_on_full_accepts_up_to_the_cap_and_shrinks_to_what_was_accepted() -> None:
    state = _Adaptive(k=2)
    state.update(drafted=2, accepted=2, max_k=4)
    state.update(drafted=3, accepted=3, max_k=4)
    state.update(drafted=4, accepted=4, max_k=4)
    assert state.k == 4  # capped
    state.update(drafted=4, accepted=1, max_k=4)
    assert (state.k, state.skip) == (2, 0)  # one accepted: ask for one more than that


def test_misses_in_a_row_back_off_exponentially_and_a_hit_resets() -> None:
    state = _Adaptive(k=3)
    skips = []
    for _ in range(7):
        state.update(drafted=state.k, accepted=0, max_k=3)
        skips.append(state.skip)
    assert state.k == 1
    assert skips == [1, 2, 4, 8, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    state.update(drafted=1, accepted=1, max_k=3)
    assert (state.misses, state.skip, state.k) == (0, 0, 2)
