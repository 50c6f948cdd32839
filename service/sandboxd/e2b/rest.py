"""E2B's REST control plane (`E2B_API_URL`) as SessionService calls.

A sandbox is a session: its id the session's, chosen by the server (`wire.sandbox_id`
writes it as a DNS label), `templateID` the template, `timeout` the
lease, `metadata` the labels (and so the list's metadata filter is a label selector), `envVars`
the session's environment. What E2B offers and sandboxd has no equal for is refused with 400
and a message naming the field, never accepted and ignored (docs/e2b.md lists them).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from sandboxd.connect import status_details
from sandboxd.digits import decimal
from sandboxd.e2b.asgi import Request, Send, reply, reply_json
from sandboxd.e2b.backend import Backend, check_api_key, metadata
from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.tokens import AccessTokens
from sandboxd.e2b.wire import sandbox_id, session_id, timestamp
from sandboxd.reasons import Reason
from sandboxd.v1 import common_pb2, session_pb2

# The envd version reported: it turns on the SDK features this door serves (default user,
# stdin and CloseStdin, octet-stream uploads) and none it does not (file metadata, entries in
# watch events).
ENVD_VERSION = "0.5.7"
CLIENT_ID = "sandboxd"
DEFAULT_TIMEOUT_S = 15  # E2B's default when a create names none
SANDBOX_PATH = re.compile(r"\A/(?:v2/)?sandboxes/([^/]+)(/[a-z]+)?\Z")

HTTP_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# Fields of a create that name something sandboxd does not offer: refused when set.
UNSUPPORTED_CREATE = ("autoPause", "autoResume", "mcp", "volumeMounts", "iam", "network")


class RestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _rest_error(exc: grpc.aio.AioRpcError) -> RestError:
    return RestError(HTTP_OF_GRPC.get(exc.code(), 500), exc.details() or str(exc.code().name))


def _reason(exc: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal from our own gRPC port ("" without one)."""
    details = status_details(exc.trailing_metadata() or ())
    for detail in details.details if details is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


def _state(state: int) -> str:
    return "paused" if state == session_pb2.SESSION_STATE_SUSPENDED else "running"


LIVE_STATES = (
    session_pb2.SESSION_STATE_CREATING,
    session_pb2.SESSION_STATE_RUNNING,
    session_pb2.SESSION_STATE_SUSPENDED,
)


class Rest:
    def __init__(self, backend: Backend, tokens: AccessTokens, domain: str) -> None:
        self._b = backend
        self._tokens = tokens
        self._domain = domain or None

    async def handle(self, request: Request, send: Send) -> None:
        try:
            status, value, headers = await self._route(request)
        except RestError as exc:
            await reply_json(send, exc.status, {"code": exc.status, "message": exc.message})
            return
        except ConnectError as exc:  # the API key's checks
            await reply_json(
                send, exc.http_status, {"code": exc.http_status, "message": exc.message}
            )
            return
        except grpc.aio.AioRpcError as exc:
            err = _rest_error(exc)
            await reply_json(send, err.status, {"code": err.status, "message": err.message})
            return
        if value is None:
            await reply(send, status, headers=headers)
        else:
            await reply_json(send, status, value, headers)

    async def _route(self, request: Request) -> tuple[int, Any, dict[str, str] | None]:
        key = check_api_key(request.header("x-api-key"))
        path, method = request.path.rstrip("/"), request.method
        if path in ("/sandboxes", "/v2/sandboxes"):
            if method == "POST":
                return 201, await self._create(key, await _json(request)), None
            if method == "GET":
                return await self._list(key, request, paged=path.startswith("/v2"))
            raise RestError(405, f"{method} is not allowed on {path}")
        m = SANDBOX_PATH.match(path)
        if m is None:
            raise RestError(404, f"no route {method} {path}")
        sid, action = session_id(m.group(1)), m.group(2) or ""
        handlers: dict[tuple[str, str], Callable[[], Awaitable[tuple[int, Any]]]] = {
            ("GET", ""): lambda: self._get(key, sid),
            ("DELETE", ""): lambda: self._kill(key, sid),
            ("POST", "/timeout"): lambda: self._timeout(key, sid, request, "timeout"),
            ("POST", "/refreshes"): lambda: self._timeout(key, sid, request, "duration"),
            ("POST", "/connect"): lambda: self._connect(key, sid, request),
            ("POST", "/pause"): lambda: self._pause(key, sid, request),
            ("POST", "/resume"): lambda: self._resume(key, sid, request),
        }
        handler = handlers.get((method, action))
        if handler is None:
            raise RestError(
                501 if method in ("GET", "POST", "PUT") else 405,
                f"{method} {path} is not served by sandboxd's E2B door (docs/e2b.md)",
            )
        status, value = await handler()
        return status, value, None

    # ----- one per route ----------------------------------------------------------------

    async def _create(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            raise RestError(400, "templateID is required")
        for name in UNSUPPORTED_CREATE:
            if body.get(name):
                raise RestError(400, f"{name} is not supported by sandboxd (docs/e2b.md)")
        if body.get("allow_internet_access") is True:
            raise RestError(
                400,
                "allow_internet_access: sandboxd sessions have no network unless an "
                "allowlist is declared through its own API (docs/e2b.md)",
            )
        timeout = _seconds(body.get("timeout", DEFAULT_TIMEOUT_S), "timeout")
        # The server chooses the id (under the tenant's prefix when authentication is on).
        req = session_pb2.CreateSessionRequest(
            template=template,
            env=_string_map(body.get("envVars"), "envVars"),
            labels=_string_map(body.get("metadata"), "metadata"),
            lease_ttl=duration_pb2.Duration(seconds=timeout),
            # E2B runs every command as `bash -l -c CMD`: a per-command allowlist cannot
            # hold through a shell, so the door does not pretend one does.
            shell=common_pb2.ShellPolicy(allow_all=True),
        )
        reply_ = await self._b.sessions.CreateSession(req, metadata=metadata(key))
        return self._sandbox(reply_.session, key)

    async def _get(self, key: str, sid: str) -> tuple[int, Any]:
        session = await self._session(key, sid)
        return 200, self._detail(session, key)

    async def _kill(self, key: str, sid: str) -> tuple[int, Any]:
        await self._session(key, sid)  # an ended session is not found, as E2B answers
        await self._b.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=sid), metadata=metadata(key)
        )
        return 204, None

    async def _timeout(self, key: str, sid: str, request: Request, name: str) -> tuple[int, Any]:
        seconds = _seconds((await _json(request)).get(name), name)
        await self._renew(key, sid, seconds)
        return 204, None

    async def _connect(self, key: str, sid: str, request: Request) -> tuple[int, Any]:
        body = await _json(request)
        session = await self._session(key, sid)
        status = 200
        if session.state == session_pb2.SESSION_STATE_SUSPENDED:
            session = await self._resume_session(key, sid)
            status = 201
        if body.get("timeout") is not None:
            session = await self._renew(key, sid, _seconds(body["timeout"], "timeout"))
        return status, self._sandbox(session, key)

    async def _pause(self, key: str, sid: str, request: Request) -> tuple[int, Any]:
        """E2B's pause keeps memory and processes; so does sandboxd's memory suspend, which a
        gVisor session on an engine that can checkpoint has. Elsewhere the pause keeps the
        filesystem (the memory suspend refuses before anything stops, so falling back loses
        nothing); a caller that asked for memory explicitly is told it cannot have it."""
        asked_memory = bool((await _json(request)).get("memory"))
        session = await self._session(key, sid)
        if session.state == session_pb2.SESSION_STATE_SUSPENDED:
            raise RestError(409, f"sandbox {sandbox_id(sid)} is already paused")
        if session.isolation == common_pb2.ISOLATION_GVISOR or asked_memory:
            try:
                await self._b.sessions.SuspendSession(
                    session_pb2.SuspendSessionRequest(
                        session_id=sid, mode=session_pb2.SUSPEND_MODE_MEMORY
                    ),
                    metadata=metadata(key),
                )
                return 204, None
            except grpc.aio.AioRpcError as exc:
                if _reason(exc) != Reason.MEMORY_SUSPEND_UNSUPPORTED:
                    raise
                if asked_memory:
                    raise RestError(
                        400, f"memory pauses are not available: {exc.details()}"
                    ) from None
        await self._b.sessions.SuspendSession(
            session_pb2.SuspendSessionRequest(session_id=sid), metadata=metadata(key)
        )
        return 204, None

    async def _resume(self, key: str, sid: str, request: Request) -> tuple[int, Any]:
        body = await _json(request)
        session = await self._session(key, sid)
        if session.state != session_pb2.SESSION_STATE_SUSPENDED:
            raise RestError(409, f"sandbox {sandbox_id(sid)} is not paused")
        session = await self._resume_session(key, sid)
        if body.get("timeout") is not None:
            session = await self._renew(key, sid, _seconds(body["timeout"], "timeout"))
        return 201, self._sandbox(session, key)

    async def _list(
        self, key: str, request: Request, *, paged: bool
    ) -> tuple[int, Any, dict[str, str] | None]:
        selector = _metadata_filter(request.arg("metadata"))
        states = set((request.arg("state") or "running,paused").split(","))
        if not states <= {"running", "paused"}:
            raise RestError(400, "state is a comma-separated list of running and paused")
        wanted = {session_pb2.SESSION_STATE_SUSPENDED} if "paused" in states else set()
        if "running" in states:
            wanted |= {session_pb2.SESSION_STATE_RUNNING, session_pb2.SESSION_STATE_CREATING}
        limit_arg = request.arg("limit")
        limit = decimal(limit_arg, max_digits=4) if limit_arg is not None else 100
        if limit is None or not 1 <= limit <= 1000:
            raise RestError(400, "limit is 1 to 1000")
        req = session_pb2.ListSessionsRequest(
            label_selector=selector,
            page_size=limit if paged else 0,
            page_token=(request.arg("nextToken") or "") if paged else "",
        )
        if wanted == {session_pb2.SESSION_STATE_SUSPENDED}:
            req.state = session_pb2.SESSION_STATE_SUSPENDED
        out: list[dict[str, Any]] = []
        while True:
            page = await self._b.sessions.ListSessions(req, metadata=metadata(key))
            out += [self._listed(s) for s in page.sessions if s.state in wanted]
            if paged or not page.next_page_token:
                break
            req.page_token = page.next_page_token
        headers = {"X-Next-Token": page.next_page_token} if paged and page.next_page_token else None
        return 200, out, headers

    # ----- helpers ----------------------------------------------------------------------

    async def running(self, key: str, sid: str) -> bool:
        """Whether the session is there and RUNNING (envd's health)."""
        try:
            got = await self._b.sessions.GetSession(
                session_pb2.GetSessionRequest(session_id=sid), metadata=metadata(key)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED):
                return False
            raise ConnectError("unavailable", exc.details() or "unavailable") from None
        return bool(got.session.state == session_pb2.SESSION_STATE_RUNNING)

    async def _session(self, key: str, sid: str) -> session_pb2.Session:
        reply_ = await self._b.sessions.GetSession(
            session_pb2.GetSessionRequest(session_id=sid), metadata=metadata(key)
        )
        if reply_.session.state not in LIVE_STATES:
            raise RestError(404, f"sandbox {sandbox_id(sid)} not found")
        session: session_pb2.Session = reply_.session
        return session

    async def _renew(self, key: str, sid: str, seconds: int) -> session_pb2.Session:
        reply_ = await self._b.sessions.RenewLease(
            session_pb2.RenewLeaseRequest(
                session_id=sid, ttl=duration_pb2.Duration(seconds=seconds)
            ),
            metadata=metadata(key),
        )
        session: session_pb2.Session = reply_.session
        return session

    async def _resume_session(self, key: str, sid: str) -> session_pb2.Session:
        reply_ = await self._b.sessions.ResumeSession(
            session_pb2.ResumeSessionRequest(session_id=sid), metadata=metadata(key)
        )
        session: session_pb2.Session = reply_.session
        return session

    def _sandbox(self, s: session_pb2.Session, key: str) -> dict[str, Any]:
        return {
            "templateID": s.template or s.image,
            "sandboxID": sandbox_id(s.session_id),
            "alias": s.template or None,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self._tokens.issue(s.session_id, key),
            "domain": self._domain,
        }

    def _listed(self, s: session_pb2.Session) -> dict[str, Any]:
        return {
            "templateID": s.template or s.image,
            "alias": s.template or None,
            "sandboxID": sandbox_id(s.session_id),
            "clientID": CLIENT_ID,
            "startedAt": timestamp(s.created_at),
            "endAt": timestamp(s.lease_expires_at),
            "cpuCount": max(1, s.limits.cpu_millis // 1000),
            "memoryMB": s.limits.memory_bytes // 2**20,
            "diskSizeMB": s.limits.workspace_bytes // 2**20,
            "metadata": dict(s.labels),
            "state": _state(s.state),
            "envdVersion": ENVD_VERSION,
        }

    def _detail(self, s: session_pb2.Session, key: str) -> dict[str, Any]:
        return {
            **self._listed(s),
            "envdAccessToken": self._tokens.issue(s.session_id, key),
            "domain": self._domain,
        }


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise RestError(400, "the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise RestError(400, "the body is not a JSON object")
    return value


def _seconds(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 10**8:
        raise RestError(400, f"{name} must be a positive number of seconds")
    return value


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RestError(400, f"{name} must map strings to strings")
    return value


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """`metadata=k1%3Dv1%26k2%3Dv2`: the SDK sends the pairs url-encoded once more."""
    if not raw:
        return {}
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=False)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}
