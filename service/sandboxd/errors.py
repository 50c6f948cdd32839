"""Domain errors of sandboxd, independent of gRPC.

Every failure a caller can cause or observe is one of these classes. The class says which
kind of failure it is (it maps to exactly one gRPC status code in `sandboxd.api.errors`),
and `reason` is the machine-readable UPPER_SNAKE word sent as `google.rpc.ErrorInfo.reason`.

    SandboxError
     +-- InvalidArgument       bad input; nothing was changed
     +-- NotFound              no such session/file/process (or another tenant's)
     +-- AlreadyExists         a caller-chosen id is taken by something different
     +-- FailedPrecondition    the request is valid but the state forbids it
     +-- PermissionDenied      the session's policy forbids it
     +-- ResourceExhausted     a cap or quota was hit
     +-- OutOfRange            an offset past the end
     +-- Unavailable           the Docker engine (or another dependency) does not answer
     +-- Unauthenticated       no bearer token, or one no tenant holds
     +-- Internal              a bug or an engine answer we did not expect
"""

from __future__ import annotations

from collections.abc import Mapping


class SandboxError(Exception):
    """Base of every error sandboxd reports to a caller."""

    default_reason = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return self.message


class InvalidArgument(SandboxError):
    default_reason = "INVALID_ARGUMENT"


class NotFound(SandboxError):
    default_reason = "NOT_FOUND"


class AlreadyExists(SandboxError):
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(SandboxError):
    default_reason = "FAILED_PRECONDITION"


class PermissionDenied(SandboxError):
    default_reason = "PERMISSION_DENIED"


class ResourceExhausted(SandboxError):
    default_reason = "RESOURCE_EXHAUSTED"


class OutOfRange(SandboxError):
    default_reason = "OUT_OF_RANGE"


class Unavailable(SandboxError):
    default_reason = "UNAVAILABLE"


class Internal(SandboxError):
    default_reason = "INTERNAL"


class Unauthenticated(SandboxError):
    default_reason = "UNAUTHENTICATED"


class EngineUnavailable(Unavailable):
    """The Docker engine did not answer; retrying later may succeed."""

    default_reason = "ENGINE_UNAVAILABLE"


class SessionNotFound(NotFound):
    default_reason = "SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found", metadata={"session_id": session_id})


class ConfigError(Exception):
    """Invalid server configuration; raised at start-up, never sent to a client."""
