"""Scenarios every `Engine` implementation with its `SandboxCommands` must pass, run against
the in-memory fakes (tests/unit/test_engine_contract_fake.py) and the Docker adapter on the
real engine with the server's commands, over the agent and over `docker exec`
(tests/integration/test_engine_contract_docker.py): what keeps the fakes honest."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sandboxd.commands import Plain, SandboxCommands, Where
from sandboxd.config import DEFAULT_LIMITS
from sandboxd.engine.protocol import Engine, SandboxRequest
from sandboxd.errors import FailedPrecondition, NotFound, ResourceExhausted, SandboxError
from sandboxd.isolation import Isolation
from sandboxd.models import (
    LimitsRequest,
    ManifestFile,
    NetworkPolicy,
    Session,
    SessionSpec,
    SessionState,
    ShellPolicy,
    WorkspaceManifest,
    WorkspaceStorage,
)
from sandboxd.sessions.manifest import write_manifest

IMAGE = "sandboxd-runtime:busybox"
DISK = WorkspaceStorage.DISK


def spec(**limits: int) -> SessionSpec:
    return SessionSpec(
        image=IMAGE,
        limits=DEFAULT_LIMITS.__class__(**{**DEFAULT_LIMITS.to_dict(), **limits}),
        shell=ShellPolicy(),
        network=NetworkPolicy(),
        env={},
        uid=65534,
        gid=65534,
        manifest=WorkspaceManifest(),
    )


def running_session() -> Session:
    """A RUNNING session record of `spec()` in container c1, for domain code driven without
    the session manager."""
    now = datetime.now(tz=UTC)
    return Session(
        session_id="s1",
        spec=spec(),
        fingerprint="f" * 64,
        state=SessionState.RUNNING,
        created_at=now,
        lease_expires_at=now,
        container_id="c1",
    )


def request(owner: str, session_id: str, s: SessionSpec | None = None) -> SandboxRequest:
    return SandboxRequest(
        spec=s or spec(),
        owner_id=owner,
        name=f"sandboxd-{owner}-{session_id}",
        session_id=session_id,
        fingerprint="f" * 64,
    )


async def _exec(
    commands: SandboxCommands, sandbox_id: str, argv: list[str], user: str = "65534:65534"
) -> tuple[int, bytes, bytes]:
    """`argv` as `user`: spec()'s, or a session's own host uid (each session has its own)."""
    out, err = bytearray(), bytearray()
    async with commands.open(Where(sandbox_id, user), Plain(tuple(argv))) as stream:
        while (chunk := await stream.read()) is not None:
            (out if chunk[0] == 1 else err).extend(chunk[1])
        code = await stream.wait_exit_code()
    return code, bytes(out), bytes(err)


async def lifecycle(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    req = request(owner, "c1")
    sid = await engine.create_sandbox(req)
    created = await engine.inspect_sandbox(sid)
    assert created is not None and not created.running
    await engine.start_sandbox(sid)
    status = await engine.inspect_sandbox(sid, req)
    assert status is not None and status.running and status.conforms
    listed = await engine.list_sandboxes(owner)
    assert [(s.sandbox_id, s.session_id, s.name) for s in listed] == [(sid, "c1", req.name)]
    await engine.remove_sandbox(sid)
    assert await engine.inspect_sandbox(sid) is None
    await engine.remove_sandbox(sid)  # already gone: not an error
    assert await engine.list_sandboxes(owner) == []


async def refusals(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    req = request(owner, "c2")
    sid = await engine.create_sandbox(req)
    try:
        with pytest.raises(FailedPrecondition) as taken:
            await engine.create_sandbox(req)  # the name is taken
        assert taken.value.reason == "ENGINE_CONFLICT"
    finally:
        await engine.remove_sandbox(sid)
    missing = request(owner, "c3", spec().__class__(**{**spec().__dict__, "image": "nope:x"}))
    assert not await engine.image_exists("nope:x")
    assert await engine.image_exists(IMAGE)
    with pytest.raises(NotFound) as no_image:
        await engine.create_sandbox(missing)
    assert no_image.value.reason == "ENGINE_OBJECT_NOT_FOUND"
    with pytest.raises(NotFound):
        await engine.start_sandbox("0" * 64)
    assert await engine.list_sandboxes(owner) == []


async def shapes(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    a = engine.sandbox_shape(request(owner, "a"))
    assert a == engine.sandbox_shape(request(owner + "x", "b"))  # bookkeeping only
    assert a != engine.sandbox_shape(request(owner, "a", spec(memory_bytes=96 * 1024 * 1024)))


async def manifest_and_exec(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    s = spec(workspace_bytes=256 * 1024)
    sid = await engine.create_sandbox(request(owner, "m1", s))
    try:
        await engine.start_sandbox(sid)
        files = (ManifestFile("a/b.txt", b"hello", 0o644),)
        session = _session("m1", s, sid, WorkspaceManifest(files=files, directories=("d",)))
        await write_manifest(commands, session)
        assert await _exec(commands, sid, ["cat", "/workspace/a/b.txt"]) == (0, b"hello", b"")
        code, out, _ = await _exec(commands, sid, ["cat", "/workspace/nope"])
        assert code != 0 and out == b""
        big = (ManifestFile("big.bin", b"x" * (512 * 1024), 0o644),)
        with pytest.raises(ResourceExhausted) as full:
            await write_manifest(commands, _session("m1", s, sid, WorkspaceManifest(files=big)))
        assert full.value.reason == "WORKSPACE_FULL"
    finally:
        await engine.remove_sandbox(sid)


def _session(session_id: str, s: SessionSpec, sid: str, manifest: WorkspaceManifest) -> Session:
    now = datetime.now(tz=UTC)
    return Session(
        session_id=session_id,
        spec=s.__class__(**{**s.__dict__, "manifest": manifest}),
        fingerprint="f" * 64,
        state=SessionState.RUNNING,
        created_at=now,
        lease_expires_at=now,
        container_id=sid,
    )


async def isolation(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    tiers = await engine.isolation_tiers()
    assert Isolation.RUNC in tiers
    g = dataclasses.replace(spec(), isolation=Isolation.GVISOR)
    assert engine.sandbox_shape(request(owner, "i")) != engine.sandbox_shape(request(owner, "i", g))
    if Isolation.GVISOR not in tiers:
        with pytest.raises(SandboxError):  # never created under another runtime
            await engine.create_sandbox(request(owner, "i1", g))
        return
    req = request(owner, "i1", g)
    sid = await engine.create_sandbox(req)
    try:
        await engine.start_sandbox(sid)
        status = await engine.inspect_sandbox(sid, req)
        assert status is not None and status.running and status.conforms
        # The same sandbox checked against a runc request does not conform (runtime moved).
        runc = await engine.inspect_sandbox(sid, request(owner, "i1"))
        assert runc is not None and not runc.conforms
        files = (ManifestFile("g.txt", b"under gvisor", 0o644),)
        await write_manifest(commands, _session("i1", g, sid, WorkspaceManifest(files=files)))
        assert await _exec(commands, sid, ["cat", "/workspace/g.txt"]) == (0, b"under gvisor", b"")
    finally:
        await engine.remove_sandbox(sid)


async def disks(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    """A disk (sandboxd.storage): made sparse and idempotent by id, refused past the host's
    room with nothing left, mounted at /workspace by a sandbox, outliving it for the next,
    not removable while mounted, copied with its files, removed with its volumes."""
    d = engine.disks
    a = "ws-ct" + secrets.token_hex(6)
    b = a + "-copy"
    mib = 1024 * 1024
    try:
        assert not await d.exists(a)
        made = await d.create(a, 64 * mib, 65534, 65534)
        assert made.size_bytes == 64 * mib and made.allocated_bytes < 16 * mib  # sparse
        assert (await d.create(a, 64 * mib, 65534, 65534)).size_bytes == 64 * mib  # idempotent
        with pytest.raises(FailedPrecondition) as other_size:
            await d.create(a, 128 * mib, 65534, 65534)
        assert other_size.value.reason == "ENGINE_CONFLICT"
        assert await d.exists(a) and a in await d.list_ids()
        with pytest.raises(ResourceExhausted) as no_room:
            await d.create(a + "-huge", 16 * 1024**4, 65534, 65534)
        assert no_room.value.reason == "ENGINE_DISK_FULL"
        assert not await d.exists(a + "-huge")
        s = dataclasses.replace(spec(workspace_bytes=64 * mib), storage=DISK, disk_id=a)
        req = request(owner, "k1", s)
        sid = await engine.create_sandbox(req)
        try:
            await engine.start_sandbox(sid)
            status = await engine.inspect_sandbox(sid, req)
            assert status is not None and status.conforms
            memory = await engine.inspect_sandbox(sid, request(owner, "k1"))
            assert memory is not None and not memory.conforms  # a tmpfs asked: not this one
            files = (ManifestFile("kept.txt", b"on disk", 0o644),)
            await write_manifest(commands, _session("k1", s, sid, WorkspaceManifest(files=files)))
            with pytest.raises(FailedPrecondition) as mounted:
                await d.delete(a)
            assert mounted.value.reason == "ENGINE_CONFLICT"
        finally:
            await engine.remove_sandbox(sid)
        await d.copy(a, b)
        for disk_id in (a, b):  # a new sandbox on each finds the file
            on = dataclasses.replace(s, disk_id=disk_id)
            sid = await engine.create_sandbox(request(owner, "k2", on))
            try:
                await engine.start_sandbox(sid)
                assert await _exec(commands, sid, ["cat", "/workspace/kept.txt"]) == (
                    0,
                    b"on disk",
                    b"",
                )
            finally:
                await engine.remove_sandbox(sid)
        assert await d.delete(a) and await d.delete(b)
        assert not await d.exists(a) and not await d.delete(a)
        assert a not in await d.list_ids()
    finally:
        for disk_id in (a, b):
            with contextlib.suppress(SandboxError):
                await d.delete(disk_id)


async def cpu_weight(engine: Engine, commands: SandboxCommands, owner: str) -> None:
    """A sandbox's CPU weight (tenant_cpu.py) is no part of its shape (a warm one takes its
    tenant's when claimed) nor of what a tampering check compares; the runc tier changes it in
    place, gVisor only where the engine says it can (runsc has no update: a local Docker
    engine's host cgroup), and a sandbox that is gone refuses."""
    weighted = dataclasses.replace(request(owner, "w1"), cpu_shares=256)
    assert engine.sandbox_shape(weighted) == engine.sandbox_shape(request(owner, "w1"))
    sid = await engine.create_sandbox(weighted)
    try:
        await engine.start_sandbox(sid)
        await engine.set_cpu_shares(sid, 128)
        status = await engine.inspect_sandbox(sid, request(owner, "w1"))
        assert status is not None and status.running and status.conforms
        # A lower CPU limit in place (a demoted tenant's cap) is still the sandbox made.
        await engine.set_cpu_shares(sid, 2, max(10, weighted.spec.limits.cpu_millis // 2))
        status = await engine.inspect_sandbox(sid, request(owner, "w1"))
        assert status is not None and status.running and status.conforms
    finally:
        await engine.remove_sandbox(sid)
    with pytest.raises(SandboxError):
        await engine.set_cpu_shares(sid, 64)
    if Isolation.GVISOR not in await engine.isolation_tiers():
        return
    g = dataclasses.replace(
        request(owner, "w2", dataclasses.replace(spec(), isolation=Isolation.GVISOR)),
        cpu_shares=512,
    )
    gid = await engine.create_sandbox(g)
    try:
        await engine.start_sandbox(gid)
        if engine.cpu_in_place(Isolation.GVISOR):  # its host cgroup, beside a local engine
            await engine.set_cpu_shares(gid, 2, max(10, g.spec.limits.cpu_millis // 2))
            status = await engine.inspect_sandbox(gid, g)
            assert status is not None and status.running and status.conforms
            return
        with pytest.raises(SandboxError):
            await engine.set_cpu_shares(gid, 128)
        status = await engine.inspect_sandbox(gid, g)
        assert status is not None and status.running  # refused, not broken
    finally:
        await engine.remove_sandbox(gid)


SCENARIOS: dict[str, Callable[[Engine, SandboxCommands, str], Awaitable[None]]] = {
    "cpu_weight": cpu_weight,
    "disks": disks,
    "isolation": isolation,
    "lifecycle": lifecycle,
    "refusals": refusals,
    "shapes": shapes,
    "manifest_and_exec": manifest_and_exec,
}


def new_owner() -> str:
    return "sbxct" + secrets.token_hex(4)


# ----- the session domain over an engine ---------------------------------------------------

SESSION_MANIFEST = WorkspaceManifest(files=(ManifestFile("src/a.txt", b"hello", 0o644),))


async def _cat(commands: SandboxCommands, session: Session, rel: str) -> bytes:
    argv = ["cat", f"/workspace/{rel}"]
    code, out, err = await _exec(commands, session.container_id, argv, session.spec.user)
    assert code == 0, err
    return out


async def session_round_trip(st: Any) -> None:
    """Create, suspend, resume, fork, a failed create, delete: what a session leaves on the
    engine at each step, whichever engine it is."""
    from sandboxd.sessions import CreateSessionInput

    s = await st.sessions.create(CreateSessionInput(session_id="rt", manifest=SESSION_MANIFEST))
    assert await _cat(st.commands, s, "src/a.txt") == b"hello"
    assert [b.session_id for b in await st.engine.list_sandboxes(st.owner)] == ["rt"]
    suspended = await st.sessions.suspend("rt")
    assert suspended.state is SessionState.SUSPENDED
    assert await st.engine.list_sandboxes(st.owner) == []
    resumed = await st.sessions.resume("rt", None)
    assert resumed.state is SessionState.RUNNING
    assert await _cat(st.commands, resumed, "src/a.txt") == b"hello"
    snap = await st.snapshots.create("rt", {}, "")
    fork = await st.sessions.create(
        CreateSessionInput(session_id="fork", from_snapshot_id=snap.snapshot_id)
    )
    assert await _cat(st.commands, fork, "src/a.txt") == b"hello"
    big = WorkspaceManifest(files=(ManifestFile("big", b"x" * (300 * 1024), 0o644),))
    with pytest.raises(ResourceExhausted):
        await st.sessions.create(
            CreateSessionInput(
                session_id="half",
                manifest=big,
                limits=LimitsRequest(workspace_bytes=256 * 1024, file_bytes=1024 * 1024),
            )
        )
    assert await st.store.get("half") is None
    assert sorted(b.session_id for b in await st.engine.list_sandboxes(st.owner)) == [
        "fork",
        "rt",
    ]
    await st.sessions.delete("rt")
    await st.sessions.delete("fork")
    assert await st.engine.list_sandboxes(st.owner) == []
    assert await st.snap_store.of_session("rt") == []


SESSION_SCENARIOS: dict[str, Callable[[Any], Awaitable[None]]] = {
    "session_round_trip": session_round_trip,
}
