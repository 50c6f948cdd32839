"""The E2B door's pause: memory and processes where the session can keep them (a gVisor session
on an engine that checkpoints), else the filesystem, never a refused pause that could have been
had; a caller asking for memory explicitly where it cannot be had is told so (400)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from sandboxd.e2b.asgi import Request
from sandboxd.e2b.rest import Rest, RestError
from sandboxd.v1 import common_pb2, session_pb2


def _unsupported() -> grpc.aio.AioRpcError:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason="MEMORY_SUSPEND_UNSUPPORTED", domain="sandboxd"))
    status = status_pb2.Status(code=9, message="runc", details=[info])
    return grpc.aio.AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString())),
        details="cannot be suspended with its memory",
    )


class Sessions:
    def __init__(self, isolation: int, memory_ok: bool) -> None:
        self.isolation, self.memory_ok = isolation, memory_ok
        self.suspends: list[int] = []

    async def GetSession(self, req: Any, metadata: Any = None) -> Any:  # noqa: N802
        return session_pb2.GetSessionResponse(
            session=session_pb2.Session(
                session_id=req.session_id,
                state=session_pb2.SESSION_STATE_RUNNING,
                isolation=self.isolation,
            )
        )

    async def SuspendSession(self, req: Any, metadata: Any = None) -> Any:  # noqa: N802
        if req.mode == session_pb2.SUSPEND_MODE_MEMORY and not self.memory_ok:
            raise _unsupported()
        self.suspends.append(req.mode)
        return session_pb2.SuspendSessionResponse()


def _request(body: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"method": "POST", "path": "/sandboxes/s-1/pause", "headers": []}
    return Request(scope, receive, 1 << 20)


def _pause(sessions: Sessions, body: bytes = b"{}") -> tuple[int, Any]:
    rest = Rest(SimpleNamespace(sessions=sessions), None, "")  # type: ignore[arg-type]
    return asyncio.run(rest._pause("key", "s-1", _request(body)))


def test_a_gvisor_session_that_can_keep_its_memory_is_paused_with_it() -> None:
    s = Sessions(common_pb2.ISOLATION_GVISOR, memory_ok=True)
    assert _pause(s)[0] == 204
    assert s.suspends == [session_pb2.SUSPEND_MODE_MEMORY]


def test_a_session_that_cannot_keep_its_memory_is_paused_with_its_files() -> None:
    for isolation in (common_pb2.ISOLATION_GVISOR, common_pb2.ISOLATION_RUNC):
        s = Sessions(isolation, memory_ok=False)
        assert _pause(s)[0] == 204
        assert s.suspends == [session_pb2.SUSPEND_MODE_UNSPECIFIED]


def test_memory_asked_for_where_it_cannot_be_had_is_refused_and_nothing_is_suspended() -> None:
    s = Sessions(common_pb2.ISOLATION_RUNC, memory_ok=False)
    try:
        _pause(s, b'{"memory": true}')
    except RestError as err:
        assert err.status == 400 and "memory" in err.message
    else:
        raise AssertionError("a memory pause of a runc session was accepted")
    assert s.suspends == []
