"""Typed exceptions decoded from the server's status and `google.rpc.ErrorInfo`.

The classes mirror the server's domain errors (`sandboxd.errors`), so a caller catches the
same names the server raises. The gRPC code picks the class; a known `reason` picks a more
specific subclass. `reason` is always set: the ErrorInfo reason when the server sent one
(domain "sandboxd"), otherwise the gRPC code's name (e.g. "UNAVAILABLE" when nothing listens).

    SandboxError
     +-- InvalidArgument
     +-- NotFound
     |    +-- SessionNotFound
     +-- AlreadyExists
     +-- FailedPrecondition
     +-- PermissionDenied
     +-- ResourceExhausted
     +-- OutOfRange
     +-- Unavailable
     |    +-- EngineUnavailable
     +-- Internal
     +-- Unauthenticated       no or a wrong bearer token
     +-- DeadlineExceeded      the call's own timeout ran out
     +-- Cancelled
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DOMAIN = "sandboxd"


class SandboxError(Exception):
    """Base of every error the client raises for a failed call."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class InvalidArgument(SandboxError):
    pass


class NotFound(SandboxError):
    pass


class SessionNotFound(NotFound):
    pass


class AlreadyExists(SandboxError):
    pass


class FailedPrecondition(SandboxError):
    pass


class PermissionDenied(SandboxError):
    pass


class ResourceExhausted(SandboxError):
    pass


class OutOfRange(SandboxError):
    pass


class Unavailable(SandboxError):
    pass


class EngineUnavailable(Unavailable):
    pass


class Internal(SandboxError):
    pass


class Unauthenticated(SandboxError):
    pass


class DeadlineExceeded(SandboxError):
    pass


class Cancelled(SandboxError):
    pass


_BY_CODE: dict[grpc.StatusCode, type[SandboxError]] = {
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
}

# Reasons that have a class of their own on the server; checked before the code table.
_BY_REASON: dict[str, type[SandboxError]] = {
    "SESSION_NOT_FOUND": SessionNotFound,
    "ENGINE_UNAVAILABLE": EngineUnavailable,
}


def _error_info(err: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # a status whose details disagree with code/message: ignore the details
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


def from_rpc_error(err: grpc.RpcError) -> SandboxError:
    """The typed exception for a failed call (an `AioRpcError` or a sync `RpcError`)."""
    code: grpc.StatusCode = err.code()
    message: str = err.details() or ""
    info = _error_info(err)
    reason = info.reason if info is not None else code.name
    metadata = dict(info.metadata) if info is not None else {}
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, SandboxError)
    return cls(message, reason=reason, code=code, metadata=metadata)
