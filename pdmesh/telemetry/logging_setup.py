"""Process-wide logging setup for services (plain text; JSON when PDMESH_LOG_JSON=1)."""

from __future__ import annotations

import json
import logging
import os
import sys


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": record.created, "level": record.levelname, "logger": record.name,
                           "msg": record.getMessage()})


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("PDMESH_LOG_JSON") == "1":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("PDMESH_LOG_LEVEL", "INFO"), handlers=[handler], force=True)
