"""Server logging: one JSON object per line (for collectors) or plain text (for a terminal).

JSON lines carry `time` (UTC, ISO 8601), `level`, `logger`, `message`, and every `extra=`
field a call passed, notably `session_id`, so one session's story can be filtered out of a
busy log. An exception adds `exc_info` with the formatted traceback.

`session_id` need not be passed by hand: the RPC layer puts the session a call is about in
`CURRENT_SESSION` (a contextvar, so it follows the call's task and the tasks it starts), and
every line logged while serving that call carries it.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

CURRENT_SESSION: ContextVar[str] = ContextVar("sandboxd_session_id", default="")
# The W3C trace id of the call being served (its `traceparent` metadata), set by the RPC layer.
CURRENT_TRACE: ContextVar[str] = ContextVar("sandboxd_trace_id", default="")

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class TraceFilter(logging.Filter):
    """Every line logged while serving a traced call carries its `trace_id` (an extra field)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id") and (trace := CURRENT_TRACE.get()):
            record.trace_id = trace
        return True


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", ...extras}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if "session_id" not in doc and (current := CURRENT_SESSION.get()):
            doc["session_id"] = current
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    """Install the one stderr handler of the server process (replacing any earlier one)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log would add a line per scrape; keep it quiet.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
