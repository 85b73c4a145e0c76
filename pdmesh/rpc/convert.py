"""Protobuf ↔ domain conversions, in one place (servicers stay thin)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from pdmesh.errors import InvalidRequestError
from pdmesh.mesh_types import KvDestination, Role, WorkerInfo
from pdmesh.request import CompletionOutput, RequestOutput, TokenLogprob
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.spec import StructuredOutput, Thinking
from pdmesh.v1 import common_pb2, generate_pb2, worker_pb2

_OPTIONAL_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed",
    "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
    "n", "priority", "include_stop_str_in_output", "num_speculative_tokens", "skip_special_tokens",
    "prompt_logprobs",
)
FINISH_CODES = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
FINISH_NAMES = {v: k for k, v in FINISH_CODES.items()}


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
    if msg.HasField("structured_output"):
        options["structured_output"] = structured_from_proto(msg.structured_output)
    options.update(overrides)
    return SamplingParams.from_dict(options)


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    """The wire form of already-validated params (the router parses once, then forwards
    this). ``n`` stays with the router, which runs one flow per completion."""
    msg = common_pb2.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        min_p=params.min_p, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
        ignore_eos=params.ignore_eos, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, repetition_penalty=params.repetition_penalty,
        stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
        priority=params.priority, include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
    )
    if params.seed is not None:
        msg.seed = params.seed
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        msg.prompt_logprobs = params.prompt_logprobs
    if params.num_speculative_tokens is not None:
        msg.num_speculative_tokens = params.num_speculative_tokens
    if params.structured_output is not None:
        msg.structured_output.CopyFrom(structured_to_proto(params.structured_output))
    return msg


def structured_from_proto(msg: common_pb2.StructuredOutput) -> StructuredOutput:
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise InvalidRequestError("structured_output", "set one of json_schema, json_object, regex, choice "
                                  "and grammar (or leave structured_output unset)")
    if kind == "json_object" and not msg.json_object:
        raise InvalidRequestError("structured_output.json_object", "must be true when set")
    thinking = cast(Thinking, msg.thinking)  # the wire's string; StructuredOutput checks its value
    if kind == "choice":
        return StructuredOutput(choice=tuple(msg.choice.choices), thinking=thinking)
    return StructuredOutput(**{kind: getattr(msg, kind)}, thinking=thinking)


def structured_to_proto(spec: StructuredOutput) -> common_pb2.StructuredOutput:
    if spec.choice is not None:
        return common_pb2.StructuredOutput(choice=common_pb2.Choices(choices=list(spec.choice)),
                                           thinking=spec.thinking)
    return common_pb2.StructuredOutput(**{spec.kind: getattr(spec, spec.kind)}, thinking=spec.thinking)


_ROLES = {
    "": worker_pb2.WORKER_ROLE_UNSPECIFIED, "prefill": worker_pb2.WORKER_ROLE_PREFILL,
    "decode": worker_pb2.WORKER_ROLE_DECODE, "kvstore": worker_pb2.WORKER_ROLE_KVSTORE,
}
_ROLE_NAMES: dict[int, Role] = {v: cast(Role, k) for k, v in _ROLES.items()}
_INFO_FIELDS = tuple(f.name for f in dataclasses.fields(WorkerInfo) if f.name != "role")


def info_to_proto(info: WorkerInfo) -> worker_pb2.WorkerInfo:
    return worker_pb2.WorkerInfo(role=_ROLES[info.role], **{f: getattr(info, f) for f in _INFO_FIELDS})


def info_from_proto(msg: worker_pb2.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(role=_ROLE_NAMES.get(msg.role, ""), **{f: getattr(msg, f) for f in _INFO_FIELDS})


def destination_to_proto(dest: KvDestination) -> worker_pb2.KvHandle:
    return worker_pb2.KvHandle(**dataclasses.asdict(dest))


def destination_from_proto(msg: worker_pb2.KvHandle) -> KvDestination:
    return KvDestination(
        worker_id=msg.worker_id, worker_address=msg.worker_address, block_ids=tuple(msg.block_ids),
        first_block=msg.first_block, cached_tokens=msg.cached_tokens, compat_hash=msg.compat_hash,
        lease_expiry_unix_ms=msg.lease_expiry_unix_ms, transfer_id=msg.transfer_id,
    )


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
    if out.prompt_logprobs:
        resp.prompt_logprobs.extend(logprob_to_proto(lp) for lp in out.prompt_logprobs)
    if out.finished:
        resp.finish_reason = FINISH_CODES[comp.finish_reason]
        if comp.stop_reason is not None:
            resp.stop_reason = str(comp.stop_reason)
        resp.usage.prompt_tokens = len(out.prompt_token_ids)
        resp.usage.completion_tokens = completion_tokens
        resp.usage.cached_tokens = out.metrics.num_cached_tokens
        resp.usage.spec_draft_tokens = out.metrics.spec_draft_tokens
        resp.usage.spec_accepted_tokens = out.metrics.spec_accepted_tokens
    return resp
