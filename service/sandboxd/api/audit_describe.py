"""What each audited RPC says about itself: proto messages -> an audit event's kind and attributes.

A `Tally` follows one call: it sees the request (or each streamed request), each reply, and says
when the call's outcome is known (`final`: Run's reply, Exec's `exited` event, StartProcess's reply)
so the interceptor records the event before that reply reaches the caller. Read-only RPCs have no
tally and are recorded only when refused.
"""

from __future__ import annotations

from typing import Any


def _duration_s(d: Any) -> str:
    return f"{d.seconds + d.nanos / 1e9:.3f}"


def _exit_attrs(exited: Any) -> dict[str, object]:
    return {
        "exit_code": exited.exit_code,
        "signal": exited.signal or None,
        "timed_out": exited.timed_out,
        "truncated": exited.truncated,
        "duration_s": _duration_s(exited.duration),
    }


class Tally:
    """The audit record of one call in the making."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.kind = ""
        self.session_id = ""
        self.attributes: dict[str, object] = {}
        self._out_bytes = 0

    # Requests ---------------------------------------------------------------------------------

    async def request(self, request: Any) -> None:
        """Each request message (one for unary calls, each for client streams)."""
        m = self.method
        sid = getattr(request, "session_id", None)
        if isinstance(sid, str) and sid and not self.session_id:
            self.session_id = sid
        if m in ("ProcessService/Run", "ProcessService/Exec", "ProcessService/StartProcess"):
            self._command(request)
        elif m == "ProcessService/Interact" and request.HasField("start"):
            self.session_id = request.start.request.session_id
            self._command(request.start.request)
            self.attributes["pty"] = request.start.HasField("pty")

    def _command(self, request: Any) -> None:
        self.kind = "command"
        self.attributes.update(argv=list(request.argv), cwd=request.cwd or "/workspace")
        if self.method == "ProcessService/StartProcess":
            self.attributes["background"] = True

    # Replies ----------------------------------------------------------------------------------

    async def reply(self, reply: Any) -> bool:
        """Each reply message; True when it is the one that tells the caller the outcome."""
        m = self.method
        if m == "ProcessService/Run":
            self.attributes.update(_exit_attrs(reply))
            self.attributes.update(
                stdout_bytes=len(reply.stdout),
                stderr_bytes=len(reply.stderr),
                process_id=reply.process_id or None,
            )
            return True
        if m in ("ProcessService/Exec", "ProcessService/Interact"):
            event = reply.WhichOneof("event")
            if event == "started":
                self.attributes["process_id"] = reply.started.process_id
            elif event == "output":
                self._out_bytes += len(reply.output.data)
            elif event == "exited":
                self.attributes.update(_exit_attrs(reply.exited))
                self.attributes["output_bytes"] = self._out_bytes
                return True
            return False
        if m == "ProcessService/StartProcess":
            self.attributes["process_id"] = reply.process.process_id
            return True
        return True


def audited(method: str) -> bool:
    """Is a successful call of `method` (`Service/Method`) an audit event?"""
    return method in _AUDITED


_AUDITED = frozenset(
    {
        "ProcessService/Run",
        "ProcessService/Exec",
        "ProcessService/Interact",
        "ProcessService/StartProcess",
    }
)
