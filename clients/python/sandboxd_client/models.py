"""The client's own result types: frozen dataclasses, never raw protobuf messages.

Enum fields are short upper-case names without the proto prefix ("RUNNING", "TAR"); times are
aware UTC datetimes (None when the server left them unset); durations are float seconds.
Each type has `from_pb` (reply -> value); inputs have `to_pb`.

This module is where they are all named; each is defined with its domain: policies and limits
(models_policies.py), sessions (models_sessions.py), files, archives and snapshots
(models_files.py), the server (models_server.py), a command's events (events.py).
"""

from __future__ import annotations

from sandboxd_client._convert import as_dict, duration, enum_value
from sandboxd_client.events import (
    Event,
    Exited,
    Keepalive,
    Output,
    OutputGap,
    ProcessInfo,
    RunResult,
    Started,
    Stream,
    event_from_pb,
)
from sandboxd_client.models_files import ArchiveImported, FileInfo, SnapshotInfo
from sandboxd_client.models_policies import (
    NetworkPolicy,
    ProxyQuotas,
    ResourceLimits,
    ShellPolicy,
)
from sandboxd_client.models_policies import SecretBinding as SecretBinding
from sandboxd_client.models_server import SecurityDefaults, ServerInfo, SweepResult
from sandboxd_client.models_sessions import EgressEvent, SessionInfo, StateReason
from sandboxd_client.volumes import VolumeMount as VolumeMount

__all__ = [
    "ArchiveImported",
    "EgressEvent",
    "Event",
    "Exited",
    "FileInfo",
    "Keepalive",
    "NetworkPolicy",
    "Output",
    "OutputGap",
    "ProcessInfo",
    "ProxyQuotas",
    "ResourceLimits",
    "RunResult",
    "SecurityDefaults",
    "ServerInfo",
    "SessionInfo",
    "ShellPolicy",
    "SnapshotInfo",
    "StateReason",
    "Started",
    "Stream",
    "SweepResult",
    "as_dict",
    "duration",
    "enum_value",
    "event_from_pb",
]
