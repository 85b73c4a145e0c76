"""The first token streamed from the prefill worker's answer: when, and what is left of the
decode worker's first message."""

from __future__ import annotations

from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import common_pb2, generate_pb2, worker_pb2
from services.router.request import first_token


def _prefill(text: str | None = " the", stopped: bool = False, logprob: bool = False) -> worker_pb2.PrefillResponse:
    resp = worker_pb2.PrefillResponse(first_token_id=42, first_stopped=stopped)
    if text is not None:
        resp.first_text = text
    if logprob:
        resp.first_logprob.token_id = 42
        resp.first_logprob.logprob = -0.5
    return resp


def test_streamed_early_only_where_the_text_is_certain() -> None:
    plain = SamplingParams(max_tokens=8, temperature=0)
    got = first_token.early(_prefill(logprob=True), plain, 10, 0)
    assert got is not None and list(got.token_ids) == [42] and got.text == " the"
    assert len(got.logprobs) == 1 and got.logprobs[0].token_id == 42
    assert not got.finish_reason and not got.HasField("usage")
    assert first_token.early(_prefill(""), plain, 10, 0).text == ""  # an incomplete character: no text yet
    assert first_token.early(_prefill(), SamplingParams(max_tokens=8, stop=("x",)), 10, 0) is None
    assert first_token.early(_prefill(text=None), plain, 10, 0) is None  # a worker that did not render it


def test_a_first_token_that_ends_the_request_is_its_last_message() -> None:
    """Finish reason, stop reason and usage as the decode worker's engine reports them."""
    one = first_token.early(_prefill(), SamplingParams(max_tokens=1), 10, 4)
    assert one.finish_reason == common_pb2.FINISH_REASON_LENGTH and one.stop_reason == ""
    assert (one.usage.prompt_tokens, one.usage.completion_tokens, one.usage.cached_tokens) == (10, 1, 4)
    going_on = first_token.early(_prefill(""), SamplingParams(max_tokens=8), 10, 0)
    assert not going_on.finish_reason
    eos = first_token.early(_prefill("", stopped=True), SamplingParams(max_tokens=8), 10, 0)
    assert eos.finish_reason == common_pb2.FINISH_REASON_STOP and eos.stop_reason == ""
    stop_id = first_token.early(_prefill(stopped=True), SamplingParams(max_tokens=8, stop_token_ids=(42,)), 10, 0)
    assert stop_id.finish_reason == common_pb2.FINISH_REASON_STOP and stop_id.stop_reason == "42"


def test_the_decode_workers_first_message_loses_the_streamed_token() -> None:
    first = generate_pb2.GenerateResponse(token_ids=[42], text=" the")
    alone = generate_pb2.GenerateResponse(token_ids=[42], text=" the")
    assert first_token.after(alone, first, "r") is None
    more = generate_pb2.GenerateResponse(token_ids=[42, 7], text=" the cat")
    more.logprobs.add(token_id=42)
    more.logprobs.add(token_id=7)
    rest = first_token.after(more, first, "r")
    assert list(rest.token_ids) == [7] and rest.text == " cat" and [lp.token_id for lp in rest.logprobs] == [7]
    last = generate_pb2.GenerateResponse(token_ids=[42], text=" the", finish_reason=common_pb2.FINISH_REASON_LENGTH)
    last.usage.completion_tokens = 1
    rest = first_token.after(last, first, "r")  # the end still reaches the caller
    assert not rest.token_ids and rest.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert rest.usage.completion_tokens == 1


def test_a_first_message_that_does_not_match_is_passed_on(caplog) -> None:  # type: ignore[no-untyped-def]
    first = generate_pb2.GenerateResponse(token_ids=[42], text=" the")
    other = generate_pb2.GenerateResponse(token_ids=[9], text="x")
    assert first_token.after(other, first, "r") is other
    assert "is not the one streamed" in caplog.text
