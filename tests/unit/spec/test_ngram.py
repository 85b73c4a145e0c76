"""Prompt lookup picks the longest earlier match, the latest among equals."""

from __future__ import annotations

import pytest

from pdmesh.config import SpeculativeConfig
from pdmesh.engine.spec.ngram import NgramProposer
from pdmesh.errors import InvalidRequestError


def test_the_longest_matching_suffix_wins_over_a_later_shorter_one() -> None:
    # Suffix [1, 2, 3]: the 3-token match at 0 beats the later 1-token match of 3 at 6.
    tokens = [1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3]
    assert NgramProposer(1, 3).lookup(tokens, 2) == [40, 41]


def test_among_equal_matches_the_latest_with_a_full_continuation_wins() -> None:
    tokens = [7, 10, 11, 12, 7, 20, 21, 22, 7]
    assert NgramProposer(1, 2).lookup(tokens, 3) == [20, 21, 22]
    # Only 1 token follows the latest 7 at the end: the earlier full continuation is used.
    assert NgramProposer(1, 2).lookup([7, 10, 11, 12, 7, 20, 7], 3) == [10, 11, 12]


def test_no_match_or_too_short_a_match_gives_no_draft() -> None:
    assert NgramProposer(1, 4).lookup([1, 2, 3, 4], 3) == []
    assert NgramProposer(2, 4).lookup([1, 2, 9, 2], 3) == []  # only a 1-token match


def test_the_index_follows_a_growing_sequence() -> None:
    from pdmesh.engine.spec.ngram import _Index

    proposer, index = NgramProposer(1, 4), _Index()
    tokens = [5, 6, 7, 8]
    assert proposer.lookup(tokens, 2, index) == []
    tokens += [5, 6]
    assert proposer.lookup(tokens, 2, index) == [7, 8]
    tokens += [7, 9, 5, 6, 7]
    assert proposer.lookup(tokens, 2, index) == [9, 5]


@pytest.mark.parametrize(
    ("config", "field"),
    [({"method": "medusa"}, "method"), ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
     ({"method": "draft_model"}, "model"), ({"method": "ngram", "k": 3}, "k"),
     ({"method": "ngram", "prompt_lookup_min": 5}, "prompt_lookup_min"), ("{not json", "speculative_config")],
)
def test_a_bad_speculative_config_names_its_field(config: object, field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SpeculativeConfig.parse(config)  # type: ignore[arg-type]
    assert field in str(err.value)


def test_vllm_style_json_is_accepted() -> None:
    cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}')
    assert cfg is not None and cfg.num_speculative_tokens == 5 and cfg.prompt_lookup_max == 3
    assert SpeculativeConfig.parse("") is None
