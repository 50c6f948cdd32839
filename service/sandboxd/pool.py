"""A warm pool of started containers, so CreateSession need not pay Docker's create+start.

Only one container shape is pooled: the one a session gets when it asks for nothing
(the server's default image, limits, user and environment, no network). A request whose
create call differs in anything but its bookkeeping misses the pool and is created cold; the
comparison is the engine's own (`Engine.sandbox_shape`, over what it would create), so a new
profile setting can never hand out a container shaped for someone else. Workspace files are
copied in on claim by the caller, exactly as after a cold start.

Every member runs as a host identity of its own (host_ids.py), taken when it is
made: its workspace tmpfs and its agent's `--user` are fixed at create. The shapes are
compared with that identity left out, and the session that claims a member takes its uid
(`Claimed`); the pool holds the id until the claimant's record does, or the member is gone.

Labels cannot change after creation, so pooled containers carry `io.sandboxd.pool=<generation>`
(one generation per server process) and no session label: a claimed container is linked to its
session only by the stored container id. Reconciliation leaves containers the pool currently
holds alone (`owns`), and removes pool containers of earlier generations that no session claims.

Where the operator's default storage is disk (`default_workspace_storage = "disk"`), members
are disk workspaces of `default_disk_bytes`: each has a disk of its own, made with its host
uid before its container (storage/disks.py), and a claimant takes the disk with the uid
(`Claimed.disk_id`). A request of another size or storage misses the pool. The disk of a
member goes with it (a discarded or drained member); the disks of a dead server's members,
which no record names, are the sweep's (sessions/recovery.py keeps `disks()`).

A claim's refill starts `REFILL_DELAY_S` later, so the claimant's first commands do not
compete with a create+start; claims that come meanwhile share that one wait.

Invariants: a member is popped synchronously before anything awaits, so no container is ever
handed out twice; the refill task is owned here and cancelled by `close`, which also removes
every member (and the one being created, if any).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import secrets
from dataclasses import dataclass

from sandboxd.config import Config
from sandboxd.engine.protocol import Engine, SandboxRequest
from sandboxd.errors import SandboxError
from sandboxd.host_ids import HostIds
from sandboxd.isolation import parse_tier
from sandboxd.metrics import Metrics
from sandboxd.models import (
    WORKSPACE_DISK_PREFIX,
    NetworkPolicy,
    SessionSpec,
    ShellPolicy,
    WorkspaceManifest,
    WorkspaceStorage,
)
from sandboxd.validation import parse_user

log = logging.getLogger(__name__)

_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A claim's refill waits this long first: a create+start keeps the engine (and on a small
# host every core) busy for a fifth of a second, and the claimant's first commands, a few
# milliseconds after its CreateSession, would wait behind it (time to interactive).
REFILL_DELAY_S = 0.25


def default_spec(config: Config) -> SessionSpec:
    """The spec of a session that sets nothing: what the pool prepares containers for."""
    uid, gid = parse_user("")
    limits = config.limits.default
    on_disk = config.limits.default_workspace_storage.upper() == WorkspaceStorage.DISK.value
    if on_disk:  # as sessions/spec.py makes a disk workspace of the default size
        limits = dataclasses.replace(limits, workspace_bytes=config.limits.default_disk_bytes)
    return SessionSpec(
        image=config.engine.image,
        limits=limits,
        storage=WorkspaceStorage.DISK if on_disk else WorkspaceStorage.MEMORY,
        # The shape's placeholder: every member has a disk of its own.
        disk_id=_SHAPE_DISK if on_disk else "",
        shell=ShellPolicy(),
        network=NetworkPolicy(),
        env={},
        uid=uid,
        gid=gid,
        manifest=WorkspaceManifest(),
        isolation=parse_tier(config.isolation.default),
    )


def pool_template(config: Config, owner_id: str, generation: str) -> SandboxRequest:
    """The request of a pool member: a default session's, marked with the pool generation."""
    return SandboxRequest(
        spec=default_spec(config),
        owner_id=owner_id,
        name=f"sandboxd-{owner_id}-pool-{generation}",
        pool_generation=generation,
    )


_SHAPE_DISK = WORKSPACE_DISK_PREFIX + "0" * 24


@dataclass(frozen=True)
class Claimed:
    """A member handed to a session: the container, the host uid (= gid) it runs as, and
    its disk workspace's disk ("" for a tmpfs member), made for that uid."""

    container_id: str
    host_id: int
    disk_id: str = ""


def _as_host(request: SandboxRequest, host_id: int, disk_id: str = "") -> SandboxRequest:
    spec = request.spec.as_host(host_id, host_id)
    if spec.on_disk:
        spec = dataclasses.replace(spec, disk_id=disk_id or spec.disk_id)
    return dataclasses.replace(request, spec=spec)


class WarmPool:
    """Started containers of one shape, refilled in the background up to `size`."""

    def __init__(
        self,
        engine: Engine,
        *,
        size: int,
        owner_id: str,
        template: SandboxRequest,
        generation: str,
        host_ids: HostIds,
        metrics: Metrics | None = None,
        refill_delay_s: float = REFILL_DELAY_S,
    ) -> None:
        self._engine = engine
        self._host_ids = host_ids
        self._refill_delay_s = refill_delay_s
        self._size = size
        self._owner_id = owner_id
        self._template = template
        self.generation = generation
        # The shape with the template's own identity in place of each request's and member's.
        self._shape_id = template.spec.uid
        self.key = engine.sandbox_shape(template)
        self._members: collections.deque[str] = collections.deque()
        self._ids: dict[str, int] = {}  # member (or claimed, unsettled) -> its host id
        self._disks: dict[str, str] = {}  # member (or claimed, unsettled) -> its disk
        self._making_disk = ""  # the disk of the member being made
        self._claiming: set[str] = set()  # popped, not yet recorded by the session
        self._creating: asyncio.Future[str] | None = None
        self._creating_name = ""
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._metrics = metrics

    @classmethod
    def for_config(
        cls,
        engine: Engine,
        config: Config,
        owner_id: str,
        host_ids: HostIds,
        metrics: Metrics | None = None,
    ) -> WarmPool:
        generation = secrets.token_hex(6)
        return cls(
            engine,
            size=config.engine.pool_size,
            owner_id=owner_id,
            template=pool_template(config, owner_id, generation),
            generation=generation,
            host_ids=host_ids,
            metrics=metrics,
        )

    @property
    def available(self) -> int:
        return len(self._members)

    def owns(self, container_id: str, name: str = "") -> bool:
        """True while the pool holds the container, is creating it (known by `name` until the
        engine answers with its id), or a claim of it is not yet recorded."""
        if name and name.lstrip("/") == self._creating_name:
            return True
        return container_id in self._members or container_id in self._claiming

    def start(self) -> None:
        if self._size > 0 and self._task is None:
            self._task = asyncio.create_task(self._refill(), name="warm-pool-refill")

    async def claim(self, request: SandboxRequest) -> Claimed | None:
        """A started container for `request`, or None (pool empty, or another shape).

        The caller records the id, and the member's host id as its session's, and then calls
        `settled(id)`.
        """
        if self._size == 0 or self._closed:
            return None
        shaped = _as_host(request, self._shape_id, _SHAPE_DISK)
        wanted, have = request.spec, self._template.spec
        other_disk = wanted.on_disk and (
            wanted.limits.workspace_bytes != have.limits.workspace_bytes
        )  # the disk's size is no part of the container's shape: compared here
        if other_disk or self._engine.sandbox_shape(shaped) != self.key:
            self._count("other_shape")
            return None
        while self._members:
            container_id = self._members.popleft()  # before any await: never handed out twice
            self._claiming.add(container_id)
            self._changed()
            try:
                status = await self._engine.inspect_sandbox(container_id)
            except BaseException:
                # Engine trouble or a cancelled call: the container was not handed out.
                self._claiming.discard(container_id)
                self._members.appendleft(container_id)
                raise
            if status is not None and status.running:
                self._count("hit")
                disk_id = self._disks.get(container_id, "")
                return Claimed(container_id, self._ids[container_id], disk_id)
            # Removed behind our back (by hand, an engine restart, a sweep): never hand it out.
            log.warning("pool container %s is gone; discarding it", container_id[:12])
            self._claiming.discard(container_id)
            await self._engine.remove_sandbox(container_id)
            await self._drop_disk(container_id)
            self._forget(container_id)
        self._count("empty")
        return None

    def settled(self, container_id: str) -> None:
        """The claimant has recorded (or removed) the container: it is no longer ours, and
        its host id is held by the claimant's record (or by nothing)."""
        self._claiming.discard(container_id)
        self._forget(container_id)

    def disks(self) -> set[str]:
        """The disks of members, of claims not yet recorded, and of the member being made:
        no record names them yet, and the sweep must keep them."""
        return {*self._disks.values(), *([self._making_disk] if self._making_disk else [])}

    async def _drop_disk(self, container_id: str) -> None:
        disk_id = self._disks.get(container_id, "")
        if disk_id:
            try:
                await self._engine.disks.delete(disk_id)
            except SandboxError as exc:  # no record names it: the sweep's
                log.warning("warm pool: disk %s not removed (%s)", disk_id, exc)

    def _forget(self, container_id: str) -> None:
        self._disks.pop(container_id, None)
        host_id = self._ids.pop(container_id, None)
        if host_id is not None:
            self._host_ids.release(host_id)

    def _changed(self) -> None:
        self._wanted.set()
        self._report()

    def _report(self) -> None:
        if self._metrics is not None:
            self._metrics.pool_available.set(len(self._members))

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.pool_claims.labels(result).inc()

    async def _refill(self) -> None:
        failures = 0
        while True:
            while len(self._members) < self._size:
                self._creating = asyncio.ensure_future(self._create_one())
                try:
                    # Shielded: a close() mid-create still learns the id and removes it.
                    await asyncio.shield(self._creating)
                except Exception as exc:  # the engine is down, or a bug: keep the loop alive
                    self._creating = None
                    delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                    failures += 1
                    log.warning(
                        "warm pool: could not start a container (%s); retry in %gs",
                        exc,
                        delay,
                        exc_info=not isinstance(exc, SandboxError),
                    )
                    await asyncio.sleep(delay)
                    continue
                self._creating = None
                failures = 0
            self._wanted.clear()
            await self._wanted.wait()
            if self._refill_delay_s > 0:
                await asyncio.sleep(self._refill_delay_s)  # the claimant goes first

    async def _create_one(self) -> str:
        name = f"{self._template.name}-{secrets.token_hex(4)}"
        host_id = await self._host_ids.take()
        self._creating_name = name
        spec = self._template.spec
        disk_id = WORKSPACE_DISK_PREFIX + secrets.token_hex(12) if spec.on_disk else ""
        try:
            request = _as_host(dataclasses.replace(self._template, name=name), host_id, disk_id)
            if disk_id:
                self._making_disk = disk_id
                await self._engine.disks.create(
                    disk_id, spec.limits.workspace_bytes, host_id, host_id
                )
            try:
                container_id = await self._engine.create_sandbox(request)
                try:
                    await self._engine.start_sandbox(container_id)
                except BaseException:
                    await asyncio.shield(self._engine.remove_sandbox(container_id))
                    raise
            except BaseException:
                if disk_id:
                    with contextlib.suppress(SandboxError):
                        await asyncio.shield(self._engine.disks.delete(disk_id))
                raise
            # Joined before the name is forgotten: never a moment when neither says "ours".
            self._ids[container_id] = host_id
            if disk_id:
                self._disks[container_id] = disk_id
            self._members.append(container_id)
            self._report()
            return container_id
        except BaseException:
            self._host_ids.release(host_id)
            raise
        finally:
            self._creating_name = ""
            self._making_disk = ""

    async def close(self) -> None:
        """Stop refilling and remove every container the pool still holds.

        Called after the gRPC server stopped, so no claim is in flight any more.
        """
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._creating is not None:  # let a create in flight finish: it joins the members
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._creating, timeout=30)
            self._creating = None
        leftovers = list(self._members)
        self._members.clear()
        results = await asyncio.gather(
            *(self._engine.remove_sandbox(c) for c in leftovers), return_exceptions=True
        )
        for container_id, result in zip(leftovers, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("warm pool: could not remove %s: %s", container_id[:12], result)
            else:
                await self._drop_disk(container_id)
            self._forget(container_id)
        self._report()
        if leftovers:
            log.info("warm pool drained: %d containers removed", len(leftovers))
