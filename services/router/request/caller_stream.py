"""A request's stream as its caller sees it: the router span and request metrics around
``RequestFlow.run``, and the abort contract (an aborted request ends with an abort
response, not an error)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from pdmesh.rpc import messages
from pdmesh.rpc.convert import FINISH_NAMES
from pdmesh.telemetry import tracing
from pdmesh.telemetry.logging_setup import bind_request

if TYPE_CHECKING:
    from services.router.request.state import RequestState

log = logging.getLogger(__name__)
access = logging.getLogger("pdmesh.access")
"""One line per finished request when the router runs with ``access_log``."""


async def caller_stream(flow: RequestState, run: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Telemetry and abort handling around ``run`` (``RequestFlow.run``: the request's
    ``GenerateResponse``s), which it yields."""
    router, rid = flow.router, flow.request_id
    timer = router.request_metrics.stream()
    span = tracing.start_span("router.generate", flow.trace, request_id=rid,
                              model=router.listed_names[0], prompt_tokens=len(flow.prompt))
    flow.trace = tracing.child_context(span)
    flow.metadata = tracing.outgoing(flow.trace)
    bind_request(rid, span)
    finish, produced, cached = "cancelled", 0, 0
    try:
        async for resp in run:
            produced += len(resp.token_ids)
            timer.tokens(len(resp.token_ids))
            if resp.finish_reason:
                finish = FINISH_NAMES.get(resp.finish_reason) or "unknown"
                timer.done(finish)
                span.set_attribute("pdmesh.completion_tokens", resp.usage.completion_tokens)
                span.set_attribute("pdmesh.cached_tokens", resp.usage.cached_tokens)
                cached = resp.usage.cached_tokens
                if resp.usage.spec_draft_tokens:
                    span.set_attribute("pdmesh.spec_draft_tokens", resp.usage.spec_draft_tokens)
                    span.set_attribute("pdmesh.spec_accepted_tokens", resp.usage.spec_accepted_tokens)
            yield resp
    except asyncio.CancelledError:
        if not flow.aborted:
            raise  # the caller went away: nothing to tell it
        # abort(): the cancelled call's cleanup released the KV on every worker; end
        # the stream the way the contract says.
        finish = "abort"
        timer.done(finish)
        yield messages.abort_response(rid, len(flow.prompt), produced)
    except Exception as exc:
        finish = "error"
        span.record_exception(exc)
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            # The router validated this request: a worker refusing it is the mesh's fault.
            log.error("a worker refused %s as invalid (%s); decode %s, prefill %s, tried %s",
                      rid, exc.details(), flow.decode.worker_id if flow.decode else "-",
                      flow.prefill.worker.worker_id if flow.prefill else "-", sorted(flow.tried))
        raise
    finally:
        span.set_attribute("pdmesh.finish_reason", finish)
        span.end()
        if router.cfg.access_log:
            end = time.monotonic()
            ttft = f"{timer.first - timer.start:.3f}s" if timer.first is not None else "-"
            access.info("%s %s: prompt %d tokens (%d cached), completion %d, ttft %s, total %.3fs, prefill %s, "
                        "decode %s", rid, finish, len(flow.prompt), cached, produced, ttft, end - timer.start,
                        flow.prefill.worker.worker_id if flow.prefill else "-",
                        flow.decode.worker_id if flow.decode else "-")

