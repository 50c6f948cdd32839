"""The error hierarchy's base, its gRPC code classes and its reason families.

`errors` re-exports all of it with one class per ErrorReason (generated from errors.proto into
`_gen.reason_errors`, each a subclass of its family here, or of its code's class where it has
no family), so an `except SpaceExhausted` catches `FileTooLarge` and `WorkspaceFull` alike.
This module imports no generated code: the generator reads `family_of` to pick each reason's
parent.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from sandboxd_client._gen.reasons import RETRYABLE

__all__ = [
    "SandboxError",
    "InvalidArgument",
    "PathError",
    "ArchiveRejected",
    "NotFound",
    "SessionNotFound",
    "FileNotFound",
    "ProcessNotFound",
    "SnapshotNotFound",
    "AlreadyExists",
    "SessionAlreadyExists",
    "FileExists",
    "ProcessAlreadyExists",
    "FailedPrecondition",
    "SessionNotRunning",
    "PermissionDenied",
    "CommandNotAllowed",
    "ResourceExhausted",
    "QuotaExceeded",
    "SpaceExhausted",
    "OutOfRange",
    "Unavailable",
    "EngineUnavailable",
    "ServerUnreachable",
    "Unauthenticated",
    "DeadlineExceeded",
    "Cancelled",
    "Internal",
    "Unknown",
    "IncompatibleServer",
    "NotSandboxd",
    "family_of",
]


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


# Reason families: the reasons a hand-named class groups (ARCHIVE_* member refusals below).
_FAMILY: dict[str, type[SandboxError]] = {
    "PATH_INVALID": PathError,
    "PATH_OUTSIDE_WORKSPACE": PathError,
    "SESSION_NOT_FOUND": SessionNotFound,
    "FILE_NOT_FOUND": FileNotFound,
    "PROCESS_NOT_FOUND": ProcessNotFound,
    "SNAPSHOT_NOT_FOUND": SnapshotNotFound,
    "SESSION_ALREADY_EXISTS": SessionAlreadyExists,
    "FILE_EXISTS": FileExists,
    "PROCESS_ALREADY_EXISTS": ProcessAlreadyExists,
    "SESSION_NOT_RUNNING": SessionNotRunning,
    "LEASE_EXPIRED": SessionNotRunning,
    "CONTAINER_LOST": SessionNotRunning,
    "COMMAND_NOT_ALLOWED": CommandNotAllowed,
    "TENANT_SESSION_QUOTA": QuotaExceeded,
    "TENANT_MEMORY_QUOTA": QuotaExceeded,
    "TENANT_EXEC_QUOTA": QuotaExceeded,
    "TOO_MANY_PROCESSES": QuotaExceeded,
    "FILE_TOO_LARGE": SpaceExhausted,
    "WORKSPACE_FULL": SpaceExhausted,
    "ENGINE_UNAVAILABLE": EngineUnavailable,
    "CONTAINER_REBUILDING": EngineUnavailable,
}


def family_of(reason: str, code: str) -> type[SandboxError]:
    """The class a reason's own class subclasses: its family, else its gRPC code's class.

    A family only stands for reasons sent with the family's code (ARCHIVE_TOO_LARGE is a
    quota, RESOURCE_EXHAUSTED, not one of the INVALID_ARGUMENT member refusals).
    """
    family = _FAMILY.get(reason)
    if family is None and reason.startswith("ARCHIVE_"):
        family = ArchiveRejected
    if family is not None and family.code.name == code:
        return family
    return BY_CODE.get(grpc.StatusCode[code], SandboxError)
