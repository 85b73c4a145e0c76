"""The first token, streamed to the caller from the prefill worker's answer.

The prefill worker samples the first token; the decode worker then commits it and streams
it as its first message. Waiting for that message put one more gRPC round trip (the
``Decode`` call, 1.9 ms p50 on a 2-core machine; docs/performance/log.md §13) between the
prompt's last chunk and the caller's first token. So the router streams the first token as
soon as ``Prefill`` returns, and takes it out of the decode worker's first message.

Only where both renderings are the same by construction: the prefill worker detokenizes
the token with the engine's own detokenizer (``first_text``), which is what the decode
worker emits unless stop strings may hold text back. A token that ends the request (EOS,
a stop token, ``max_tokens`` of 1) becomes the last message, with the finish reason, stop
reason and usage the decode worker would have sent, and the reservation is given back
without a ``Decode`` call.
"""

from __future__ import annotations

import logging
from typing import Any

from pdmesh.rpc import messages
from pdmesh.sampling_params import SamplingParams

log = logging.getLogger(__name__)


def early(prefill: Any, params: SamplingParams, prompt_tokens: int, cached_tokens: int) -> Any | None:
    """The caller's first message from a ``PrefillResponse`` (its last, with finish reason
    and usage, when the token ends the request), or None to wait for the decode worker's:
    stop strings, or an older prefill worker that does not render the text."""
    if params.stop or not prefill.HasField("first_text"):
        return None
    token = prefill.first_token_id
    if prefill.first_stopped:  # EOS or a stop token, as the engine's finish_status decides
        stop_reason = str(token) if token in params.stop_token_ids else ""
        return messages.first_token_response(prefill, "stop", stop_reason, prompt_tokens, cached_tokens)
    if params.max_tokens <= 1:
        return messages.first_token_response(prefill, "length", "", prompt_tokens, cached_tokens)
    return messages.first_token_response(prefill)


def after(resp: Any, first: Any, request_id: str) -> Any | None:
    """The decode worker's first message less the token the caller already has (None when
    nothing is left of it)."""
    if not resp.token_ids or resp.token_ids[0] != first.token_ids[0]:
        # The decode worker commits the token the router sent it; anything else is a bug.
        log.error("%s: the decode worker's first token %s is not the one streamed (%s)",
                  request_id, list(resp.token_ids[:1]), first.token_ids[0])
        return resp
    text = first.text
    if not resp.text.startswith(text):
        log.error("%s: the decode worker rendered the first token as %r, %r was streamed",
                  request_id, resp.text, first.text)
        text = ""
    rest = messages.without_first_token(resp, text)
    if not rest.token_ids and not rest.text and not rest.finish_reason:
        return None
    return rest
