"""Domain errors of sandboxd, independent of gRPC.

Every failure a caller can cause or observe is one of these classes. The class says which
kind of failure it is (it maps to exactly one gRPC status code in `sandboxd.api.errors`),
and `reason` is the machine-readable UPPER_SNAKE word sent as `google.rpc.ErrorInfo.reason`:
a `sandboxd.reasons.Reason` (the proto's ErrorReason without its prefix).

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
from typing import ClassVar

from sandboxd.reasons import Reason


class SandboxError(Exception):
    """Base of every error sandboxd reports to a caller."""

    default_reason: ClassVar[Reason] = Reason.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        reason: Reason | str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        # A plain str either way: Reason members and literals compare and serialize the same.
        self.reason: str = str(reason or self.default_reason)
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return self.message


class InvalidArgument(SandboxError):
    default_reason = Reason.INVALID_ARGUMENT


class NotFound(SandboxError):
    default_reason = Reason.NOT_FOUND


class AlreadyExists(SandboxError):
    default_reason = Reason.ALREADY_EXISTS


class FailedPrecondition(SandboxError):
    default_reason = Reason.FAILED_PRECONDITION


class PermissionDenied(SandboxError):
    default_reason = Reason.PERMISSION_DENIED


class ResourceExhausted(SandboxError):
    default_reason = Reason.RESOURCE_EXHAUSTED


class OutOfRange(SandboxError):
    default_reason = Reason.OUT_OF_RANGE


class Unavailable(SandboxError):
    default_reason = Reason.UNAVAILABLE


class Internal(SandboxError):
    default_reason = Reason.INTERNAL


class Unauthenticated(SandboxError):
    default_reason = Reason.UNAUTHENTICATED


class DeadlineExceeded(SandboxError):
    """A call that ran out of its time (an idle interaction)."""

    default_reason = Reason.INTERACT_IDLE


class EngineUnavailable(Unavailable):
    """The Docker engine did not answer; retrying later may succeed."""

    default_reason = Reason.ENGINE_UNAVAILABLE


class SessionNotFound(NotFound):
    default_reason = Reason.SESSION_NOT_FOUND

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found", metadata={"session_id": session_id})


class ConfigError(Exception):
    """Invalid server configuration; raised at start-up, never sent to a client."""


class ConfigProblems(ConfigError):
    """Every problem of a configuration at once (`sandboxd check-config` lists them all; the
    server stops at start-up naming the first, and how many more there are)."""

    def __init__(self, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more: `sandboxd check-config` lists them)"
        super().__init__(problems[0] + (more if len(problems) > 1 else ""))
        self.problems = tuple(problems)
