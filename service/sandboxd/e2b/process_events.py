"""sandboxd's process events as envd's ProcessEvent messages (JSON codec)."""

from __future__ import annotations

from typing import Any

from sandboxd.e2b.wire import b64
from sandboxd.v1 import process_pb2


def end_event(exited: process_pb2.ProcessExited) -> dict[str, Any]:
    """E2B's EndEvent: `exited` false and a `signal: ...` status when a signal ended it."""
    end: dict[str, Any] = {"exitCode": exited.exit_code, "exited": not exited.signal}
    if exited.signal:
        end["status"] = f"signal: {exited.signal.removeprefix('SIG').lower()}"
        end["exitCode"] = -1
    else:
        end["status"] = f"exit status {exited.exit_code}"
    if exited.timed_out:
        end["error"] = "the command ran past the server's command timeout"
    elif exited.truncated:
        end["error"] = "the command's output went over the server's cap and it was killed"
    return {"event": {"end": end}}


def output_event(stream: int, chunk: bytes) -> dict[str, Any]:
    name = "stderr" if stream == process_pb2.OUTPUT_STREAM_STDERR else "stdout"
    return {"event": {"data": {name: b64(chunk)}}}
