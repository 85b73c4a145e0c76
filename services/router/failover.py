"""A decode worker that failed a request, left for another (``RequestFlow``'s reserve,
KV-write and mid-stream failures all go through here)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from pdmesh.errors import UnavailableError

if TYPE_CHECKING:
    from services.router.flow import RequestFlow

log = logging.getLogger(__name__)


def replace_decode(flow: RequestFlow, exc: grpc.aio.AioRpcError, stage: str) -> None:
    """Leave a decode worker that failed this request for another healthy one, or try
    it again before the stream starts when it is the only one and not known to be dead
    (its reservation was given back); UNAVAILABLE when none is left. Only a call that
    found it unreachable marks it down at once; a failed KV write or a broken call may
    be this request's own, so the registry asks the worker for its Info instead
    (``Registry.call_failed``): marked down, the only decode worker refused every
    request routed until its next Info, and one failure became many."""
    core, failed, code = flow.core, flow.decode_worker(), exc.code()
    core.workers.call_failed(failed, exc)
    flow.failed_decode.add(failed.worker_id)
    try:
        replacement, held = core.route_decode(flow.hashes, exclude=flow.failed_decode, tokens=flow.kv_tokens)
    except UnavailableError:
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise exc from None  # every decode worker is full: "not now", with its retry hint
        if not failed.healthy or stage == "mid-stream":  # mid-stream it may still run there
            raise
        replacement, held = failed, flow.decode_held
    if replacement is not failed:
        failed.release()
        flow.decode, flow.decode_held = replacement, held
        replacement.acquire()
    log.warning("decode worker %s failed %s (%s) for %s after %d tokens; continuing on %s", failed.worker_id,
                stage, code.name, flow.request_id, len(flow.streamed_tokens), replacement.worker_id)
