"""Protobuf ↔ domain conversions, in one place (servicers stay thin)."""

from __future__ import annotations

from typing import Any

from pdmesh.request import CompletionOutput, RequestOutput, TokenLogprob
from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import common_pb2, generate_pb2

_OPTIONAL_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed",
    "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
)
_FINISH = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
FINISH_NAMES = {v: k for k, v in _FINISH.items()}


def sampling_from_proto(msg: common_pb2.SamplingParams, **overrides: Any) -> SamplingParams:
    """Validated ``SamplingParams``; raises ``InvalidRequestError`` naming the field."""
    options: dict[str, Any] = {}
    for name in _OPTIONAL_FIELDS:
        if msg.HasField(name):
            value = getattr(msg, name)
            # float32 on the wire: round to what the user most likely typed.
            options[name] = round(value, 6) if isinstance(value, float) else value
    if msg.stop:
        options["stop"] = tuple(msg.stop)
    if msg.stop_token_ids:
        options["stop_token_ids"] = tuple(msg.stop_token_ids)
    options.update(overrides)
    return SamplingParams.from_dict(options)


def logprob_to_proto(lp: TokenLogprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=lp.token_id, logprob=lp.logprob, rank=lp.rank,
        top=[common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
    )


def logprob_from_proto(msg: common_pb2.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(msg.token_id, msg.logprob, msg.rank, tuple((t.token_id, t.logprob) for t in msg.top))


def response_from_output(
    out: RequestOutput, request_id: str, completion_tokens: int
) -> generate_pb2.GenerateResponse:
    """One streamed response from a delta ``RequestOutput`` (first completion).

    ``completion_tokens`` is the running total, reported in ``usage`` on the last one.
    """
    comp: CompletionOutput | None = out.outputs[0] if out.outputs else None
    resp = generate_pb2.GenerateResponse(request_id=request_id)
    if comp is None:
        return resp
    resp.token_ids.extend(comp.token_ids)
    resp.text = comp.text
    if comp.logprobs:
        resp.logprobs.extend(logprob_to_proto(lp) for lp in comp.logprobs)
    if out.finished:
        resp.finish_reason = _FINISH[comp.finish_reason]
        if comp.stop_reason is not None:
            resp.stop_reason = str(comp.stop_reason)
        resp.usage.prompt_tokens = len(out.prompt_token_ids)
        resp.usage.completion_tokens = completion_tokens
        resp.usage.cached_tokens = out.metrics.num_cached_tokens
    return resp
