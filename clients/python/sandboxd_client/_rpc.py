"""Which RPC each client method wraps, which RPCs are idempotent, and how they are retried.

Retries happen in two places, each for what it can see:
- gRPC's own retry policy (the channel's service config) retries the idempotent RPCs on
  UNAVAILABLE, with exponential backoff and jitter, inside the call's deadline;
- `RetryPolicy.backoff` drives the client's loop for what a service config cannot express:
  retryable ErrorInfo reasons sent with another code (ENGINE_CONFLICT), and CreateSession with
  a caller-chosen id (idempotent only then, so not per method).
A call that is not idempotent (Exec, Run, StartProcess, CreateSnapshot, Remove...) is never
retried: the server may have done it before the answer was lost.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

PACKAGE = "sandboxd.v1"


class _Unset:
    def __repr__(self) -> str:
        return "<the client's default deadline>"


# A `timeout=` left out: the client's default deadline applies (None means no deadline).
UNSET: Any = _Unset()

IDEMPOTENT = frozenset(
    f"{PACKAGE}.{name}"
    for name in (
        "AdminService/GetServerInfo",
        "AdminService/ListImages",
        "SessionService/GetSession",
        "SessionService/ListSessions",
        "SessionService/RenewLease",
        "SessionService/DeleteSession",
        "SessionService/UpdateNetworkPolicy",
        "SessionService/ListEgressEvents",
        "FilesystemService/ReadFile",
        "FilesystemService/WriteFile",
        "FilesystemService/ListDir",
        "FilesystemService/Stat",
        "ProcessService/AttachProcess",
        "ProcessService/ListProcesses",
        "ProcessService/GetProcess",
        "ProcessService/CloseProcessStdin",
        "SnapshotService/ExportArchive",
        "SnapshotService/GetSnapshot",
        "SnapshotService/ListSnapshots",
        "SnapshotService/DownloadSnapshot",
        "AuditService/ListAuditEvents",
        "SessionService/GetSessionStats",
        "SessionService/ListPorts",
        "TemplateService/GetTemplate",
        "TemplateService/ListTemplates",
        "TemplateService/DeleteTemplate",
        "VolumeService/GetVolume",
        "VolumeService/ListVolumes",
        "VolumeService/DeleteVolume",
    )
)

F = TypeVar("F", bound=Callable[..., Any])


def rpc(method: str) -> Callable[[F], F]:
    """Mark a client method as the wrapper of `Service/Method` (the surface test reads it)."""

    def mark(fn: F) -> F:
        fn.__sandboxd_rpc__ = f"{PACKAGE}.{method}"  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(max, initial*m^n))."""

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 5:  # gRPC caps retry attempts at 5
            raise ValueError("max_attempts must be between 1 and 5")
        if self.initial_backoff <= 0 or self.max_backoff < self.initial_backoff:
            raise ValueError("backoffs must be positive, max_backoff >= initial_backoff")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")

    def backoff(self, attempt: int) -> float:
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier**attempt)
        return random.uniform(0, cap)

    def service_config(self) -> str:
        """gRPC service config: the idempotent methods retry on UNAVAILABLE."""
        names = [
            {"service": full.split("/")[0], "method": full.split("/")[1]}
            for full in sorted(IDEMPOTENT)
        ]
        config: dict[str, Any] = {"methodConfig": []}
        if self.max_attempts > 1:
            config["methodConfig"].append(
                {
                    "name": names,
                    "retryPolicy": {
                        "maxAttempts": self.max_attempts,
                        "initialBackoff": f"{self.initial_backoff}s",
                        "maxBackoff": f"{self.max_backoff}s",
                        "backoffMultiplier": self.multiplier,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            )
        return json.dumps(config)
