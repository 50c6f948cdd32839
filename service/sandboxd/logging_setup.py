"""Server logging: one JSON object per line (for collectors) or plain text (for a terminal).

JSON lines carry `time` (UTC, ISO 8601), `level`, `logger`, `message`, and every `extra=`
field a call passed, notably `session_id`, so one session's story can be filtered out of a
busy log. An exception adds `exc_info` with the formatted traceback.

`session_id` need not be passed by hand: the RPC layer puts the session a call is about in
`CURRENT_SESSION` (a contextvar, so it follows the call's task and the tasks it starts), and
every line logged while serving that call carries it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import threading
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
    """`{"time", "level", "logger", "message", ...extras}` on one line.

    A busy server writes a line per call (the access log), on the loop's thread: the time's
    text is made once per second (a datetime and its isoformat cost more than the rest of
    the line) and one encoder is kept, not made again by each `json.dumps`."""

    def __init__(self) -> None:
        super().__init__()
        self._encode = json.JSONEncoder(ensure_ascii=False).encode
        self._second = -1
        self._second_text = ""

    def _time(self, created: float) -> str:
        """ISO 8601 in UTC to the millisecond, as `datetime.isoformat` writes it: the
        microseconds rounded as `datetime.fromtimestamp` rounds them, then cut."""
        fraction, whole = math.modf(created)
        micros = round(fraction * 1_000_000)
        second = int(whole)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        if second != self._second:
            stamp = datetime.fromtimestamp(second, tz=UTC)
            self._second, self._second_text = second, stamp.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._second_text}.{micros // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self._time(record.created),
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
        return self._encode(doc)


class BatchingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Lines logged on the event loop are written together, once per loop iteration.

    A busy server logs a line per call (the access log): written one by one, each was a write
    and a flush, a system call on the loop per call. Here a line logged from the loop's
    thread waits for the end of the loop's current pass (`call_soon`), at most `MAX_LINES`
    lines or `MAX_BYTES`; a line from any other thread, or with no loop running, writes what
    is waiting and itself at once, so the order stays the order of logging. `flush` (and
    logging's shutdown at exit) writes what is waiting; only a kill without exit can lose
    the lines of the pass it interrupted.
    """

    MAX_LINES = 256
    MAX_BYTES = 64 * 1024

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._bytes = 0
        self._scheduled_on: asyncio.AbstractEventLoop | None = None  # whose pass writes them

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        loop = _running_loop()
        self._lines.append(line)
        self._bytes += len(line)
        if loop is None or self._bytes >= self.MAX_BYTES or len(self._lines) >= self.MAX_LINES:
            self._write()
        elif self._scheduled_on is not loop:  # none yet, or on a loop that ended before it ran
            self._scheduled_on = loop
            loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._scheduled_on = None
            self._write()

    def _write(self) -> None:
        """Under the handler's lock (emit and flush hold it)."""
        if not self._lines:
            return
        text, self._lines, self._bytes = "".join(self._lines), [], 0
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # a closed stderr: logging must never take the server down
            pass

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()
            super().flush()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (the main thread's, in the server)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def configure_logging(level: str, fmt: str) -> None:
    """Install the one stderr handler of the server process (replacing any earlier one).

    Every record also stops gathering what no line of the server prints (the logging HOWTO's
    "Optimization"): the caller's file and line (a walk up the stack per record), the thread,
    the process and its name. A busy server logs a line per call on its one loop thread; the
    line costs about 40% less without them (docs/performance.md)."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BatchingHandler(sys.stderr)
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
