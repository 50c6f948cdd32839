"""Typed exceptions decoded from the server's status and `google.rpc.ErrorInfo`.

The gRPC code picks the class; the ErrorInfo reason (the proto's `ErrorReason`, here
`Reason`) picks its own class, named after it (`FileTooLarge` for FILE_TOO_LARGE, generated
from errors.proto), a subclass of its family where it has one (`SpaceExhausted`) and of its
code's class in any case (`ResourceExhausted`), so each `except` may be as narrow as it
needs. Every exception carries `reason` (the ErrorInfo reason, or the code's name when the
server sent none), `code`, `metadata` and `retryable` (the same call may succeed later).

The families (each reason's own class sits under its family, or under its code's class):

    SandboxError
     +-- InvalidArgument
     |    +-- PathError               PATH_INVALID, PATH_OUTSIDE_WORKSPACE
     |    +-- ArchiveRejected         ARCHIVE_*
     +-- NotFound
     |    +-- SessionNotFound / FileNotFound / ProcessNotFound / SnapshotNotFound
     +-- AlreadyExists
     |    +-- SessionAlreadyExists / FileExists / ProcessAlreadyExists
     +-- FailedPrecondition
     |    +-- SessionNotRunning       LeaseExpired, ContainerLost
     +-- PermissionDenied
     |    +-- CommandNotAllowed
     +-- ResourceExhausted
     |    +-- QuotaExceeded           TenantSessionQuota, ..., TooManyProcesses
     |    +-- SpaceExhausted          FileTooLarge, WorkspaceFull
     +-- OutOfRange
     +-- Unavailable
     |    +-- EngineUnavailable       ContainerRebuilding
     |    +-- ServerUnreachable       nothing answers at the address (closed port, no route)
     +-- Unauthenticated              TOKEN_MISSING, TOKEN_INVALID
     +-- DeadlineExceeded             the caller's deadline ran out
     +-- Cancelled
     +-- Internal / Unknown
     +-- IncompatibleServer           a sandboxd of another major API version
          +-- NotSandboxd             a gRPC server without sandboxd's API
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from sandboxd_client import _families
from sandboxd_client._families import *  # noqa: F403
from sandboxd_client._families import (
    BY_CODE,
    DeadlineExceeded,
    NotSandboxd,
    SandboxError,
    ServerUnreachable,
)
from sandboxd_client._gen import reason_errors
from sandboxd_client._gen.reason_errors import *  # noqa: F403
from sandboxd_client._gen.reason_errors import BY_REASON
from sandboxd_client._gen.reasons import Reason

if TYPE_CHECKING:
    from google.rpc import error_details_pb2

DOMAIN = "sandboxd"

__all__ = [
    "BY_CODE",
    "BY_REASON",
    "DOMAIN",
    "Reason",
    "from_rpc_error",
]
__all__ += _families.__all__
__all__ += reason_errors.__all__


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    # The status details' decoders, only once a call failed: a call that succeeds never
    # needs them (and they are a good part of an import of this module).
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

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
