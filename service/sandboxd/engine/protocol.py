"""What sandboxd needs from a container engine, in its own terms: the `Engine` protocol.

Sessions, snapshots, the warm pool, the sweeper and the egress manager depend on this protocol
only; `sandboxd.engine.docker` implements it on the Docker Engine API, and the unit tests'
in-memory fake implements it too. Toward the sandbox's side the engine has two duties, each a
protocol of its own: `AgentAttach` (a pipe to the agent that is the sandbox's main process, and
its rescue) and `EngineExec` (the engine's own exec: the fallback for a sandbox without an
agent, and the rescue's path). Commands themselves belong to `sandboxd.commands`, which runs
them over the agent first and the engine's exec when it must.

A sandbox is asked for as a `SandboxRequest` (a session's spec plus bookkeeping), never as an
engine-specific document: how a spec becomes a hardened container is the adapter's business
(see `docker_profile`).

Errors: an engine that does not answer raises `EngineUnavailable`; a missing object is
`NotFound` with reason ENGINE_OBJECT_NOT_FOUND, a conflicting one `FailedPrecondition` with
ENGINE_CONFLICT; anything else the engine refuses is `Internal`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandboxd.agent.port import AgentAttach, Attached, ExecRequest, ExecStatus, Paused
from sandboxd.isolation import Isolation
from sandboxd.models import SessionSpec
from sandboxd.storage.disks import Disks

__all__ = [  # the port types of the agent side, read here by the engine's adapters too
    "AgentAttach",
    "Attached",
    "ExecRequest",
    "ExecStatus",
    "Paused",
]


@dataclass(frozen=True)
class SandboxRequest:
    """One sandbox to create: the session's spec and what marks the sandbox as ours.

    A pool member has no session id and carries its pool generation instead.
    """

    spec: SessionSpec
    owner_id: str
    name: str
    session_id: str = ""
    fingerprint: str = ""
    # ALLOWLIST sessions: the port the agent listens on for egress, in the sandbox's loopback
    # (HTTP(S)_PROXY point there); 0 for every other session. No session has a network.
    egress_port: int = 0
    pool_generation: str = ""
    # The sandbox's CPU weight against every other sandbox on the host (the kernel's cgroup
    # share; 0: the engine's default, 1024). Not part of its shape: the service sets it per
    # tenant (tenant_cpu.py), and changes it in place where the runtime can.
    cpu_shares: int = 0


@dataclass(frozen=True)
class SandboxStatus:
    """What the engine says of one sandbox: running, and (when asked against a request)
    whether its limits and security settings are still the ones it was created with."""

    running: bool
    conforms: bool = True


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox of this server's owner id, as listed."""

    sandbox_id: str
    name: str
    session_id: str = ""
    pool_generation: str = ""
    running: bool = False  # as listed (reconcile inspects only those it must look at again)


@dataclass(frozen=True)
class NetworkInfo:
    """A network labelled with this server's owner id: servers before egress went over the
    agent's channel made one per ALLOWLIST session (`sandboxd-net-<owner>-<session>`)."""

    network_id: str
    name: str
    containers: int = 0  # attached now: one in use is never removed


@dataclass(frozen=True)
class SandboxStats:
    """One reading of a sandbox's resource use (the engine's stats API)."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0  # 0 where the engine cannot say (cgroup v2 without memory.peak)
    processes: int = 0
    network_bytes: int = 0  # received + sent over its network interfaces (none but loopback)
    cpu_throttled_s: float = 0.0


@dataclass(frozen=True)
class ImageDetails:
    """What the engine holds of one image (registry pulls, ListImages, the image sweep)."""

    image_id: str
    repo_digests: tuple[str, ...] = ()
    repo_tags: tuple[str, ...] = ()
    size_bytes: int = 0
    onbuild: tuple[str, ...] = ()  # the ONBUILD triggers a build FROM it would run


@dataclass(frozen=True)
class BuildLimits:
    """What each step of an image build may use (templates)."""

    memory_bytes: int
    millicpus: int
    file_bytes: int = 0  # the largest file a step may write (RLIMIT_FSIZE); 0: no limit


@dataclass(frozen=True)
class PullProgress:
    """One line of a pull's progress: `layer` is empty for lines about the whole image."""

    status: str
    layer: str = ""
    current: int = 0
    total: int = 0


class ExecStream(Protocol):
    """A running command with its stdio: 1 = stdout, 2 = stderr (one stream with a tty)."""

    exec_id: str

    async def read(self) -> tuple[int, bytes] | None:
        """Next (fd, data) chunk; None at the end of output."""
        ...

    async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
        """Like read(), joined with the frames of the same fd already arrived (up to about
        `limit` bytes); waits only for the first."""
        ...

    async def write(self, data: bytes) -> None: ...

    def close_stdin(self) -> None:
        """Half-close: the command sees EOF on stdin while its output keeps flowing."""
        ...

    async def close(self) -> None: ...

    async def exit_code(self) -> int | None:
        """The exit code once the process has ended (None while it still runs)."""
        ...

    async def wait_exit_code(self) -> int:
        """The exit code after the output ended; -1 if the engine never records one."""
        ...


class Engine(Protocol):
    """A container engine as sandboxd uses it. Every id is the engine's own."""

    @property
    def disks(self) -> Disks:
        """Disks a sandbox mounts (disk workspaces, named volumes): sandboxd.storage.disks. A
        request whose spec is on disk is created on its disk, which must exist (`create`)."""
        ...

    async def ping(self) -> str:
        """The engine's API version; raises EngineUnavailable when it does not answer."""
        ...

    async def image_exists(self, image: str) -> bool: ...

    async def isolation_tiers(self) -> frozenset[Isolation]:
        """The isolation tiers the engine can run now (its registered runtimes); asked at
        start-up and whenever the engine comes back, since an operator may add a runtime."""
        ...

    # ----- sandboxes ---------------------------------------------------------------------

    def sandbox_shape(self, request: SandboxRequest) -> str:
        """Identity of what `create_sandbox` would make of `request`, ignoring its
        bookkeeping (name, ids, labels): the warm pool hands out a member only to a request
        of the same shape, so a new profile setting can never leak across shapes."""
        ...

    async def create_sandbox(self, request: SandboxRequest) -> str:
        """Create (not start) the hardened sandbox; returns its id."""
        ...

    async def start_sandbox(self, sandbox_id: str) -> None: ...

    async def set_cpu_shares(self, sandbox_id: str, shares: int, cpu_millis: int = 0) -> None:
        """Change a running sandbox's CPU weight in place (its cgroup's share) and, given
        `cpu_millis` (0: unchanged), its CPU limit, never above the one it was made with (the
        tampering check takes a lower limit as conforming). runsc cannot change a sandbox's
        cgroups after its start (the engine refuses its update), so a gVisor sandbox changes only
        where `cpu_in_place` says so (beside a local engine, its host cgroup is written)."""
        ...

    def cpu_in_place(self, isolation: Isolation) -> bool:
        """Whether `set_cpu_shares` can change a running sandbox of this tier."""
        ...

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Force-remove; one already gone is not an error. Returns once it is gone."""
        ...

    async def inspect_sandbox(
        self, sandbox_id: str, expected: SandboxRequest | None = None
    ) -> SandboxStatus | None:
        """None when the sandbox does not exist; `conforms` compares against `expected`."""
        ...

    async def list_sandboxes(self, owner_id: str) -> list[SandboxInfo]: ...

    @property
    def agent_port(self) -> AgentAttach | None:
        """The pipe to each sandbox's agent (`sbx agent` as its main process); None when the
        engine starts its sandboxes without one (commands then go through `EngineExec`)."""
        ...

    # ----- memory checkpoints (gVisor sandboxes: sessions/memory_suspension.py) ---------

    async def memory_checkpoints(self) -> str:
        """Empty when the engine can checkpoint a gVisor sandbox with its processes and memory
        and restore it; else why not, in words (the probe behind the `memory_suspend` feature)."""
        ...

    async def checkpoint_sandbox(self, sandbox_id: str, name: str) -> None:
        """Checkpoint the sandbox's processes and memory under `name`; the sandbox stops.
        On failure the caller asks `inspect_sandbox` whether it still runs."""
        ...

    def read_checkpoint(self, sandbox_id: str, name: str) -> AsyncIterator[bytes]:
        """The checkpoint `name` of the (stopped) sandbox, as a tar."""
        ...

    async def restore_sandbox(
        self, sandbox_id: str, name: str, chunks: AsyncIterator[bytes]
    ) -> None:
        """Place the checkpoint tar `chunks` as `name` in a created (not started) sandbox of the
        same shape and start the sandbox from it: its processes run on where they were."""
        ...

    # ----- images (IMAGE snapshots) ------------------------------------------------------

    async def commit_sandbox(
        self, sandbox_id: str, repository: str, tag: str, labels: Mapping[str, str]
    ) -> str:
        """Freeze the sandbox's filesystem into an image; returns the image id. The image
        carries its base image's config and `labels`, nothing of the sandbox's own (its env,
        command, user, labels), and no sandboxd label of the base that `labels` does not set."""
        ...

    async def remove_work_leftovers(self, owner_id: str) -> list[str]:
        """Remove the work containers of this owner a dead server left behind: the stand-ins
        of commits cut short, disk tool runs and checkpoint carriers (none under way is
        touched); the names of what was removed, for the log."""
        ...

    async def remove_image(self, image: str) -> None:
        """One already gone is not an error; one in use is FailedPrecondition ENGINE_CONFLICT."""
        ...

    async def list_images(self, owner_id: str) -> list[str]:
        """Ids of the images labelled with this owner id."""
        ...

    # ----- leftover networks (servers before egress over the agent) ---------------------

    async def list_networks(self, owner_id: str) -> list[NetworkInfo]:
        """The networks labelled with this owner id, with how many containers each holds."""
        ...

    async def remove_network(self, network_id: str) -> None:
        """One already gone is not an error."""
        ...

    # ----- observation (session stats and events) ------------------------------------------

    async def sandbox_stats(self, sandbox_id: str) -> SandboxStats:
        """One reading now; NotFound when the sandbox is gone."""
        ...

    def oom_kills(self, owner_id: str) -> AsyncIterator[str]:
        """Ids of this owner's sandboxes as the kernel OOM-kills a process in them, live,
        until cancelled (the engine's event stream)."""
        ...

    # ----- registry pulls (sandboxd.pulls) -----------------------------------------------

    async def inspect_image(self, image: str) -> ImageDetails | None:
        """None when the engine does not hold it; no VOLUME check (that is image_exists)."""
        ...

    def pull_image(
        self, reference: str, auth: Mapping[str, str] | None = None
    ) -> AsyncIterator[PullProgress]:
        """Pull `reference` (`name:tag` or `name@sha256:...`), yielding progress until it is
        complete; closing the iterator early abandons the pull. `auth`: the registry's
        `username`/`password` (never logged). Registry refusals are `PullRefused`."""
        ...

    # ----- image builds (sandboxd.templates) ---------------------------------------------

    def build_image(
        self,
        context: Path,
        *,
        dockerfile: str,
        tag: str,
        labels: Mapping[str, str],
        limits: BuildLimits,
    ) -> AsyncGenerator[str, None]:
        """Build the tar at `context` (its Dockerfile at `dockerfile` inside it) with no network
        and `limits`, tagging the result `tag`; yields the log's lines. A failing step is
        FailedPrecondition TEMPLATE_BUILD_FAILED; closing the iterator early abandons it."""
        ...

    async def prune_images(self, labels: Mapping[str, str]) -> None:
        """Remove every image carrying all of `labels` that no container uses."""
        ...

    async def build_usage(self, labels: Mapping[str, str]) -> int:
        """How large, in bytes, the image a running build makes is so far: the largest of
        the images and the step containers' root filesystems (image plus what the step
        wrote) carrying all of `labels`; 0 when there are none."""
        ...


class EngineExec(Protocol):
    """The engine's own way to run a command in a sandbox (`docker exec`, a pod's exec): the
    path for a sandbox without an agent, and the one the agent's rescue kills through."""

    def exec(
        self, sandbox_id: str, request: ExecRequest
    ) -> AbstractAsyncContextManager[ExecStream]:
        """Start a command in the sandbox; the stream is closed when the context exits."""
        ...

    async def exec_resize(self, exec_id: str, rows: int, cols: int) -> None: ...

    async def exec_status(self, exec_id: str) -> ExecStatus: ...
