"""Process-wide logging: text by default, JSON with ``PDMESH_LOG_JSON=1``.

Every record carries the request id and trace id of the request being served (context
variables set by the handlers, one task per call), so a log line can be found from a trace
and the other way round. Prompts and outputs are never logged.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("pdmesh_request_id", default="")
trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("pdmesh_trace_id", default="")


def bind_request(request_id: str, span=None) -> None:
    """Tag this task's log records with the request (and its trace, when one is recorded)."""
    request_id_var.set(request_id)
    if span is not None:
        ctx = span.get_span_context()
        if ctx.is_valid:
            trace_id_var.set(format(ctx.trace_id, "032x"))


class _RequestContext(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.trace_id = trace_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": record.created, "level": record.levelname, "logger": record.name,
               "msg": record.getMessage()}
        for key in ("request_id", "trace_id"):
            value = getattr(record, key, "")
            if value:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", "")
        return f"{line} [request={rid} trace={getattr(record, 'trace_id', '') or '-'}]" if rid else line


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestContext())
    if os.environ.get("PDMESH_LOG_JSON") == "1":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("PDMESH_LOG_LEVEL", "INFO"), handlers=[handler], force=True)
