import pytest

from pdmesh.errors import InvalidRequestError
from pdmesh.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("options", "field", "needle"),
    [
        ({"temperature": -0.1}, "temperature", ">= 0"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", "[0, 2147483647]"),
        ({"top_k": 2**31}, "top_k", "[0, 2147483647]"),  # the wire's int32
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"max_tokens": 0}, "max_tokens", "[1, 4294967295]"),
        ({"max_tokens": 2**32}, "max_tokens", "[1, 4294967295]"),  # the wire's uint32
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "<= max_tokens"),
        ({"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "> 0"),
        ({"n": 0}, "n", "[1, 64]"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"stop": ("",)}, "stop", "non-empty"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids", "[0, 4294967295]"),
        ({"stop_token_ids": (2**40,)}, "stop_token_ids", "[0, 4294967295]"),
        ({"output_kind": "everything"}, "output_kind", "'delta'"),
        ({"max_tokens": 1.5}, "max_tokens", "integer"),
        ({"temperatur": 0.5}, "temperatur", "unknown sampling option"),
    ],
)
def test_each_bad_value_names_its_field_and_range(options: dict, field: str, needle: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_dict(options)
    assert err.value.field == field
    assert needle in str(err.value)


def test_defaults_and_normalisation() -> None:
    p = SamplingParams.from_dict({"stop": "###", "top_k": -1, "temperature": 0})
    assert p.stop == ("###",) and p.top_k == 0 and p.greedy and p.max_stop_len == 3


def test_request_sizes_are_bounded_with_the_limit_in_the_message() -> None:
    import pytest

    from pdmesh.errors import InvalidRequestError
    from pdmesh.sampling_params import SamplingParams

    for kwargs, field, limit in [
        (dict(stop=tuple("s" + str(i) for i in range(33))), "stop", "at most 32"),
        (dict(stop=("x" * 513,)), "stop", "at most 512"),
        (dict(stop_token_ids=tuple(range(1025))), "stop_token_ids", "at most 1024"),
        (dict(cache_salt="s" * 513), "cache_salt", "at most 512"),
    ]:
        with pytest.raises(InvalidRequestError, match=limit) as err:
            SamplingParams(**kwargs)
        assert err.value.field == field
