"""One request's outputs as the messages a decode worker sends, with its telemetry."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pdmesh.request import RequestOutput
from pdmesh.rpc.convert import response_from_output

if TYPE_CHECKING:
    from pdmesh.v1 import generate_pb2
    from services.worker.worker import Worker


class Relay:
    """Turns each delta output into a ``GenerateResponse`` and records, on the way, what the
    request's span and the worker's metrics say about it (first token, finish, cache)."""

    def __init__(self, worker: Worker, request_id: str, span: Any, prefills: bool, resumed: int = 0) -> None:
        self.worker, self.request_id, self.span = worker, request_id, span
        self.prefills = prefills
        """The prompt is computed here (a local prefill), not written by a prefill worker."""
        self.total = resumed
        """Completion tokens so far: a resumed request's usage counts the tokens another
        worker streamed before it (the caller has them), not only this worker's."""
        self.sent = 0
        self.timer = worker.request_metrics.stream()

    def __call__(self, out: RequestOutput) -> generate_pb2.GenerateResponse:
        n = len(out.outputs[0].token_ids) if out.outputs else 0
        if n and not self.sent:
            m = out.metrics
            self.span.set_attributes({
                "pdmesh.first_token_ms": 1000 * (time.monotonic() - self.timer.start),
                "pdmesh.queue_wait_ms": 1000 * ((m.first_scheduled_time or m.arrival_time) - m.arrival_time),
            })
        self.total += n
        self.sent += n
        self.timer.tokens(n)
        if out.finished:
            self._finished(out)
        return response_from_output(out, self.request_id, self.total)

    def _finished(self, out: RequestOutput) -> None:
        cached = out.metrics.num_cached_tokens
        self.worker.counters.cached_prompt_tokens += cached
        if self.prefills:
            # A local prefill's cost, as a prefill worker counts its own: without it a decode
            # worker that prefilled read as computing nothing (hit rate 1.0 in its metrics).
            self.worker.counters.computed_prompt_tokens += max(0, len(out.prompt_token_ids) - cached)
        reason = out.outputs[0].finish_reason or "unknown" if out.outputs else "unknown"
        self.timer.done(reason)
        self.span.set_attributes({"pdmesh.finish_reason": reason, "pdmesh.tokens": self.sent,
                                  "pdmesh.cached_tokens": cached})
        if out.metrics.spec_steps:
            self.span.set_attributes({
                "pdmesh.spec_draft_tokens": out.metrics.spec_draft_tokens,
                "pdmesh.spec_accepted_tokens": out.metrics.spec_accepted_tokens,
                "pdmesh.spec_mean_accepted_length": out.metrics.spec_mean_accepted_length or 0.0,
            })
