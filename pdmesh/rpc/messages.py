"""Builders of the internal request messages the router sends to workers.

The router works with domain values (ids, ``SamplingParams``); these turn them into the
wire messages in one place. Responses it merely relays (a decode worker's token stream)
pass through untouched: converting every streamed token twice would cost throughput.
"""

from __future__ import annotations

from typing import Any

from pdmesh.rpc.convert import FINISH_CODES, sampling_to_proto
from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import common_pb2, generate_pb2, worker_pb2


def reserve_request(rid: str, ids: list[int], params: SamplingParams, lease_ms: int,
                    resume: tuple[list[int], int] | None = None) -> worker_pb2.ReserveRequest:
    """``resume``: (tokens already streamed, characters of their text streamed)."""
    msg = worker_pb2.ReserveRequest(
        request_id=rid, prompt_token_ids=ids, sampling=sampling_to_proto(params),
        cache_salt=params.cache_salt or "", lease_ms=lease_ms,
    )
    if resume is not None:
        msg.resume_token_ids.extend(resume[0])
        msg.resume_text_chars = resume[1]
    return msg


def prefill_request(rid: str, ids: list[int], params: SamplingParams, handle: Any,
                    outside: dict[str, int] | None = None) -> worker_pb2.PrefillRequest:
    """``handle`` is the decode worker's ``KvHandle``, forwarded as it came; None: it follows
    in a second message (``PrefillStream``, ``destination_message``). ``outside``: what the
    router's index lookup listed beyond the prefill workers (None: it did not read the index)."""
    msg = worker_pb2.PrefillRequest(
        request_id=rid, prompt_token_ids=ids, sampling=sampling_to_proto(params),
        cache_salt=params.cache_salt or "",
    )
    if handle is not None:
        msg.destination.CopyFrom(handle)
    if outside is not None:
        msg.index_view.SetInParent()  # present even when it lists nothing
        msg.index_view.tier_blocks.update(outside)
    return msg


def destination_message(rid: str, handle: Any) -> worker_pb2.PrefillRequest:
    """``PrefillStream``'s second message: the destination alone."""
    msg = worker_pb2.PrefillRequest(request_id=rid)
    msg.destination.CopyFrom(handle)
    return msg


def stop_message(rid: str) -> worker_pb2.PrefillRequest:
    """``PrefillStream``'s third message, when the request will not decode: stop, and end the
    call once no KV write is in flight."""
    return worker_pb2.PrefillRequest(request_id=rid, stop=True)


def decode_request(rid: str, prefill_response: Any, handle: Any) -> worker_pb2.DecodeRequest:
    msg = worker_pb2.DecodeRequest(
        request_id=rid, first_token_id=prefill_response.first_token_id,
        cached_tokens=max(handle.cached_tokens, prefill_response.cached_tokens),
        transfer_id=handle.transfer_id,
    )
    if prefill_response.HasField("first_logprob"):
        msg.first_logprob.CopyFrom(prefill_response.first_logprob)
    _pass_landing(prefill_response, msg)
    return msg


def _pass_landing(prefill_response: Any, msg: Any) -> None:
    """Tell the decode worker how the prefill's KV landed (``services/decode/write_path.py``),
    when the prefill said."""
    if prefill_response is not None and prefill_response.HasField("kv_written_inline"):
        msg.kv_written_inline = prefill_response.kv_written_inline


def renew_request(rid: str, lease_ms: int) -> worker_pb2.RenewLeaseRequest:
    return worker_pb2.RenewLeaseRequest(request_id=rid, lease_ms=lease_ms)


def release_request(rid: str, prefill_response: Any = None) -> worker_pb2.ReleaseRequest:
    """``prefill_response``: the prefill's answer when its KV was written here, so the
    decode worker learns how that KV landed (as from ``decode_request``)."""
    msg = worker_pb2.ReleaseRequest(request_id=rid)
    _pass_landing(prefill_response, msg)
    return msg


def abort_response(rid: str, prompt_tokens: int, completion_tokens: int) -> generate_pb2.GenerateResponse:
    """The last message of a stream ended by ``Abort``."""
    return generate_pb2.GenerateResponse(
        request_id=rid, finish_reason=common_pb2.FINISH_REASON_ABORT,
        usage=generate_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
    )


def first_token_response(prefill_response: Any, finish: str | None = None, stop_reason: str = "",
                         prompt_tokens: int = 0, cached_tokens: int = 0) -> generate_pb2.GenerateResponse:
    """The caller's message for the first token, from a ``PrefillResponse`` that rendered
    its text (``first_text``); with ``finish``, the last message of a request that ends
    with it (its usage as the decode worker would report it)."""
    resp = generate_pb2.GenerateResponse(token_ids=[prefill_response.first_token_id],
                                         text=prefill_response.first_text)
    if prefill_response.HasField("first_logprob"):
        resp.logprobs.append(prefill_response.first_logprob)
    if finish is not None:
        resp.finish_reason = FINISH_CODES[finish]
        resp.stop_reason = stop_reason
        resp.usage.prompt_tokens = prompt_tokens
        resp.usage.completion_tokens = 1
        resp.usage.cached_tokens = cached_tokens
    return resp


def without_first_token(resp: Any, text: str) -> generate_pb2.GenerateResponse:
    """``resp`` less its first token, that token's logprobs and ``text``, its rendering."""
    rest = generate_pb2.GenerateResponse()
    rest.CopyFrom(resp)
    del rest.token_ids[:1]
    if rest.logprobs:
        del rest.logprobs[:1]
    rest.text = resp.text[len(text):]
    return rest
