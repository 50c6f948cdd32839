"""Sections of what a session gets: resource limits, leases, archives, events, the
in-sandbox agent and directory watches."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sandboxd.config_sections.units import GiB, MiB
from sandboxd.models import LIMIT_NAMES, Limits
from sandboxd.settings import (
    BOOL,
    DURATION,
    INT,
    SIZE,
    TEXT,
    setting,
)


@dataclass(frozen=True)
class LimitsSection:
    """Resource limits of a session: what it gets when it asks for none, and the most it may ask."""

    default_memory_bytes: int = setting(256 * MiB, SIZE, "default memory_bytes", lo=6 * MiB)
    default_cpu_millis: int = setting(500, INT, "default cpu_millis", lo=10)
    default_pids: int = setting(64, INT, "default pids", lo=1)
    default_workspace_bytes: int = setting(64 * MiB, SIZE, "default workspace_bytes", lo=1)
    default_file_bytes: int = setting(1 * MiB, SIZE, "default file_bytes", lo=1)
    default_output_bytes: int = setting(1 * MiB, SIZE, "default output_bytes", lo=1)
    default_command_timeout_s: float = setting(
        10.0, DURATION, "default command_timeout_s", lo=0, lo_open=True
    )
    max_memory_bytes: int = setting(2 * GiB, SIZE, "largest memory_bytes", lo=1)
    max_cpu_millis: int = setting(2000, INT, "largest cpu_millis", lo=1)
    max_pids: int = setting(512, INT, "largest pids", lo=1)
    max_workspace_bytes: int = setting(1 * GiB, SIZE, "largest workspace_bytes", lo=1)
    max_file_bytes: int = setting(16 * MiB, SIZE, "largest file_bytes", lo=1)
    max_output_bytes: int = setting(16 * MiB, SIZE, "largest output_bytes", lo=1)
    max_command_timeout_s: float = setting(
        3600.0, DURATION, "largest command_timeout_s", lo=0, lo_open=True
    )
    # Disk workspaces (docs/workspaces.md): not limits (the Limits record is the tmpfs's),
    # but what a create may ask of its workspace.
    default_workspace_storage: str = setting(
        "memory",
        TEXT,
        "where a session's /workspace lives when it asks for neither: memory (a tmpfs counted "
        "against its memory) or disk (a sparse ext4 disk on the engine host)",
        choices=("memory", "disk"),
    )
    default_disk_bytes: int = setting(
        10 * GiB,
        SIZE,
        "size of a disk workspace that asks for none (sparse: an empty one costs a few MiB)",
        lo=16 * MiB,
    )
    max_disk_bytes: int = setting(
        100 * GiB,
        SIZE,
        "largest disk workspace a session may ask for (its size_bytes)",
        lo=16 * MiB,
        hi=16 * 1024 * GiB,
    )
    process_output_buffer_bytes: int = setting(
        128 * MiB,
        SIZE,
        "server memory one session's background processes may hold: their output rings "
        "without the agent; with it, the live tails of the running ones",
        lo=1,
    )
    listing_bytes: int = setting(
        8 * MiB, SIZE, "the most one ListDir walk may print before it is refused", lo=4096
    )
    file_buffer_bytes: int = setting(
        32 * MiB,
        SIZE,
        "server memory one session's listings and file reads may hold at once",
        lo=4096,
    )

    # Built once: every command's spec reads `max` (a frozen section, so it cannot go stale).
    @functools.cached_property
    def default(self) -> Limits:
        return Limits(**{n: getattr(self, f"default_{n}") for n in LIMIT_NAMES})

    @functools.cached_property
    def max(self) -> Limits:
        return Limits(**{n: getattr(self, f"max_{n}") for n in LIMIT_NAMES})


@dataclass(frozen=True)
class LeasesSection:
    """How long sessions live and how often expired ones are reaped."""

    default_s: float = setting(
        900.0, DURATION, "lease of a session that asks for none", flat="lease_default_s"
    )
    max_s: float = setting(
        86400.0, DURATION, "longest lease a session may have", flat="lease_max_s"
    )
    reaper_interval_s: float = setting(
        5.0, DURATION, "how often expired leases are reaped", lo=0, lo_open=True
    )


@dataclass(frozen=True)
class ArchiveSection:
    """Archive import and export."""

    max_members: int = setting(
        100_000, INT, "most members one imported tar may hold", lo=1, flat="archive_max_members"
    )


@dataclass(frozen=True)
class EventsSection:
    """Session events (WatchSession, WatchSessions)."""

    lease_warning_s: float = setting(
        60.0,
        DURATION,
        "LEASE_EXPIRING is sent this long before a lease ends",
        lo=0.1,
        flat="events_lease_warning",
    )
    window: int = setting(
        1000,
        INT,
        "events kept per tenant for a reconnecting watcher",
        lo=1,
        hi=100_000,
        flat="events_window",
    )


@dataclass(frozen=True)
class AgentSection:
    """The in-sandbox agent and its channel (docs/agent.md)."""

    enabled: bool = setting(
        True,
        BOOL,
        "run commands through each sandbox's agent (off: docker exec and an idle keeper)",
        flat="agent",
    )
    keepalive_s: float = setting(
        5.0, DURATION, "agent channel keepalive period", lo=0.1, hi=300, flat="agent_keepalive"
    )
    handshake_s: float = setting(
        10.0,
        DURATION,
        "how long an agent may take to answer a new channel epoch",
        lo=0.5,
        hi=300,
        flat="agent_handshake",
    )
    window: int = setting(
        1 * MiB,
        SIZE,
        "flow-control window of each agent stream, per direction",
        lo=4096,
        hi=16 * MiB,
        flat="agent_window",
    )
    window_max: int = setting(
        8 * MiB,
        SIZE,
        "the largest an agent stream's inbound window grows to while its reader keeps up "
        "(bulk output; below agent_window: no growth)",
        lo=4096,
        hi=64 * MiB,
        flat="agent_window_max",
    )
    detached_processes: bool = setting(
        True,
        BOOL,
        "background processes kept by the agent through a server crash and restart",
        flat="agent_detached_processes",
    )
    socket: bool = setting(
        True,
        BOOL,
        "with the engine on this host's unix socket, a runc sandbox's agent channel is a Unix "
        "socket between server and agent, in a tmpfs volume of its own (off, or gVisor, a TCP "
        "engine, a server not root: the engine's attach)",
        flat="agent_socket",
    )


@dataclass(frozen=True)
class WatchSection:
    """Directory watches (FilesystemService.WatchDir)."""

    max_per_session: int = setting(
        64, INT, "open WatchDir streams per session", lo=1, hi=10_000, flat="watch_max_per_session"
    )
    coalesce_s: float = setting(
        0.05,
        DURATION,
        "MODIFIED events of one file within this window are sent as one (0: each one)",
        lo=0,
        hi=10.0,
        flat="watch_coalesce",
    )
    queue: int = setting(
        1024,
        INT,
        "events a watch holds for a slow client before it drops them for an OVERFLOW event",
        lo=1,
        hi=1_000_000,
        flat="watch_queue",
    )
    max_directories: int = setting(
        8192,
        INT,
        "directories one recursive watch may watch (beyond: OVERFLOW)",
        lo=1,
        hi=1_000_000,
        flat="watch_max_directories",
    )
