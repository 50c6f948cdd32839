"""Typed exceptions decoded from the server's status and `google.rpc.ErrorInfo`.

The gRPC code picks the class; the ErrorInfo reason (the proto's `ErrorReason`, here
`Reason`) picks a more specific family class where one exists. Every exception carries
`reason` (the ErrorInfo reason, or the code's name when the server sent none), `code`,
`metadata` and `retryable` (the same call may succeed later).

    SandboxError
     +-- InvalidArgument
     |    +-- PathError               PATH_INVALID, PATH_OUTSIDE_WORKSPACE
     |    +-- ArchiveRejected         ARCHIVE_*
     +-- NotFound
     |    +-- SessionNotFound / FileNotFound / ProcessNotFound / SnapshotNotFound
     +-- AlreadyExists
     |    +-- SessionAlreadyExists / FileExists / ProcessAlreadyExists
     +-- FailedPrecondition
     |    +-- SessionNotRunning       SESSION_NOT_RUNNING, LEASE_EXPIRED, CONTAINER_LOST
     +-- PermissionDenied
     |    +-- CommandNotAllowed
     +-- ResourceExhausted
     |    +-- QuotaExceeded           TENANT_*_QUOTA, TOO_MANY_PROCESSES
     |    +-- SpaceExhausted          FILE_TOO_LARGE, WORKSPACE_FULL
     +-- OutOfRange
     +-- Unavailable
     |    +-- EngineUnavailable       ENGINE_UNAVAILABLE, CONTAINER_REBUILDING
     |    +-- ServerUnreachable       nothing answers at the address (closed port, no route)
     +-- Unauthenticated              TOKEN_MISSING, TOKEN_INVALID
     +-- DeadlineExceeded             the caller's deadline ran out
     +-- Cancelled
     +-- Internal / Unknown
     +-- IncompatibleServer           a sandboxd of another major API version
          +-- NotSandboxd             a gRPC server without sandboxd's API
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sandboxd_client._gen.reasons import CODE, RETRYABLE, Reason

DOMAIN = "sandboxd"

__all__ = ["DOMAIN", "Reason", "SandboxError", "from_rpc_error"]


class SandboxError(Exception):
    """Base of every error the client raises for a failed call."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        code: grpc.StatusCode | None = None,
        metadata: Mapping[str, str] | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        if code is not None:
            self.code = code
        self.metadata: dict[str, str] = dict(metadata or {})
        if retryable is None:
            retryable = (
                self.code == grpc.StatusCode.UNAVAILABLE
                or reason in RETRYABLE
                or self.metadata.get("retry") == "true"
            )
        self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class InvalidArgument(SandboxError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class PathError(InvalidArgument):
    pass


class ArchiveRejected(InvalidArgument):
    pass


class NotFound(SandboxError):
    code = grpc.StatusCode.NOT_FOUND


class SessionNotFound(NotFound):
    pass


class FileNotFound(NotFound):
    pass


class ProcessNotFound(NotFound):
    pass


class SnapshotNotFound(NotFound):
    pass


class AlreadyExists(SandboxError):
    code = grpc.StatusCode.ALREADY_EXISTS


class SessionAlreadyExists(AlreadyExists):
    pass


class FileExists(AlreadyExists):
    pass


class ProcessAlreadyExists(AlreadyExists):
    pass


class FailedPrecondition(SandboxError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class SessionNotRunning(FailedPrecondition):
    pass


class PermissionDenied(SandboxError):
    code = grpc.StatusCode.PERMISSION_DENIED


class CommandNotAllowed(PermissionDenied):
    pass


class ResourceExhausted(SandboxError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaExceeded(ResourceExhausted):
    pass


class SpaceExhausted(ResourceExhausted):
    pass


class OutOfRange(SandboxError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unavailable(SandboxError):
    code = grpc.StatusCode.UNAVAILABLE


class EngineUnavailable(Unavailable):
    pass


class ServerUnreachable(Unavailable):
    pass


class Unauthenticated(SandboxError):
    code = grpc.StatusCode.UNAUTHENTICATED


class DeadlineExceeded(SandboxError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SandboxError):
    code = grpc.StatusCode.CANCELLED


class Internal(SandboxError):
    code = grpc.StatusCode.INTERNAL


class Unknown(SandboxError):
    code = grpc.StatusCode.UNKNOWN


class IncompatibleServer(SandboxError):
    """The server does not speak this client's API version; no call was made."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class NotSandboxd(IncompatibleServer):
    """The address answers gRPC, but not sandboxd's API (UNIMPLEMENTED)."""

    code = grpc.StatusCode.UNIMPLEMENTED


BY_CODE: dict[grpc.StatusCode, type[SandboxError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
}

# Reason families: a reason's class, when sent with the code its class stands for.
BY_REASON: dict[str, type[SandboxError]] = {
    Reason.PATH_INVALID: PathError,
    Reason.PATH_OUTSIDE_WORKSPACE: PathError,
    # The archive refusals of the member rules; ARCHIVE_TOO_LARGE is a quota (RESOURCE_EXHAUSTED).
    **{
        r.value: ArchiveRejected
        for r in Reason
        if r.name.startswith("ARCHIVE_") and CODE[r.value] == "INVALID_ARGUMENT"
    },
    Reason.SESSION_NOT_FOUND: SessionNotFound,
    Reason.FILE_NOT_FOUND: FileNotFound,
    Reason.PROCESS_NOT_FOUND: ProcessNotFound,
    Reason.SNAPSHOT_NOT_FOUND: SnapshotNotFound,
    Reason.SESSION_ALREADY_EXISTS: SessionAlreadyExists,
    Reason.FILE_EXISTS: FileExists,
    Reason.PROCESS_ALREADY_EXISTS: ProcessAlreadyExists,
    Reason.SESSION_NOT_RUNNING: SessionNotRunning,
    Reason.LEASE_EXPIRED: SessionNotRunning,
    Reason.CONTAINER_LOST: SessionNotRunning,
    Reason.COMMAND_NOT_ALLOWED: CommandNotAllowed,
    Reason.TENANT_SESSION_QUOTA: QuotaExceeded,
    Reason.TENANT_MEMORY_QUOTA: QuotaExceeded,
    Reason.TENANT_EXEC_QUOTA: QuotaExceeded,
    Reason.TOO_MANY_PROCESSES: QuotaExceeded,
    Reason.FILE_TOO_LARGE: SpaceExhausted,
    Reason.WORKSPACE_FULL: SpaceExhausted,
    Reason.ENGINE_UNAVAILABLE: EngineUnavailable,
    Reason.CONTAINER_REBUILDING: EngineUnavailable,
}


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # a status whose details disagree with code/message: ignore them
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN:
                return info
    return None


def from_rpc_error(err: grpc.RpcError, address: str = "") -> SandboxError:
    """The typed exception for a failed call (an `AioRpcError` or a sync `RpcError`).

    A status without sandboxd's ErrorInfo came from the transport or from another server:
    its text is gRPC's, so the message says where and what in plain words first.
    """
    code: grpc.StatusCode = err.code()
    details: str = err.details() or ""
    info = _error_info(err)
    if info is not None:
        cls = BY_REASON.get(info.reason)
        if cls is None or cls.code != code:
            cls = BY_CODE.get(code, SandboxError)
        return cls(details, reason=info.reason, code=code, metadata=dict(info.metadata))
    target = address or "the server"
    where = f"sandboxd at {address}" if address else target
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServerUnreachable(
            f"cannot reach {where} ({_first_line(details)})", reason=code.name, code=code
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return NotSandboxd(
            f"{target} does not serve sandboxd's API ({_first_line(details)})",
            reason="NOT_SANDBOXD",
            code=code,
            retryable=False,
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(
            f"the deadline ran out waiting for {where}", reason=code.name, code=code
        )
    cls = BY_CODE.get(code, SandboxError)
    return cls(_first_line(details) or code.name, reason=code.name, code=code)


def _first_line(text: str) -> str:
    """gRPC's own text, one line and bounded: never a transport trace."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:300]
