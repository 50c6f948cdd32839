"""Disk workspaces (docs/workspaces.md): create, 1 GiB in and out, suspend/resume and fork.

Metrics (names owned by this module):
- `create_disk_session`: p50 ms of CreateSession of a disk workspace (10 GiB, sparse), against
  raw: the same disk made with the server's own disk code (`DockerDisks`, the tool container)
  plus a create+start of the same container profile mounting it. Extra `memory_cold_ms`: a
  cold tmpfs CreateSession in the same rounds. (A disk session is never served from the warm
  pool: the pool's members are tmpfs-shaped.)
- `disk_write_1gib`, `disk_read_1gib`: MB/s of `dd` writing (fsync) and reading 1 GiB in the
  session's disk workspace, against the same `dd` exec'd in the raw container on its own disk.
- `disk_suspend_resume_1gib`: p50 ms of SuspendSession + ResumeSession of a session holding
  1 GiB on disk (the disk stays: no tar); extra `tar_path_ms`, the same for a tmpfs session
  holding 1 GiB (the snapshot's tar round trip).
- `disk_fork_1gib`: p50 ms of CreateSnapshot + CreateSession(from_snapshot_id) of that disk
  session; extra `tmpfs_fork_ms` for the tmpfs one (both go through the snapshot's tar).

Few rounds: each moves a GiB or two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import duration_pb2
from sandboxd.engine.docker_errors import translate_errors
from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.helper_volume import HelperVolume
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.models import WorkspaceStorage
from sandboxd.storage.docker_disks import DockerDisks
from sandboxd.v1 import common_pb2, process_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

from bench.common import (
    BenchContext,
    Metric,
    default_spec,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
)

GiB = 1024**3
DISK_BYTES = 10 * GiB
ONE_GIB_MB = GiB
WRITE = "dd if=/dev/zero of=/workspace/big bs=1M count=1024 conv=fsync 2>/dev/null"
READ = "dd if=/workspace/big of=/dev/null bs=1M 2>/dev/null"
DISK_WS = session_pb2.WorkspaceManifest(
    storage=session_pb2.WORKSPACE_STORAGE_DISK, size_bytes=DISK_BYTES
)
TIMEOUT = duration_pb2.Duration(seconds=300)


def _disks(ctx: BenchContext) -> DockerDisks:
    return DockerDisks(
        lambda: ctx.docker,
        translate_errors,
        owner_id=ctx.raw_owner,
        tool_image="sandboxd-disktool:1",
    )


@contextlib.asynccontextmanager
async def _raw_disk_container(ctx: BenchContext) -> AsyncIterator[tuple[str, float]]:
    """The raw side: a disk made by the server's own disk code and a container of the same
    profile on it; yields (container id, ms to make both), removes both afterwards."""
    disks = _disks(ctx)
    disk_id = "ws-bench" + secrets.token_hex(6)
    spec = dataclasses.replace(
        default_spec(ctx.image), storage=WorkspaceStorage.DISK, disk_id=disk_id
    )
    spec = dataclasses.replace(
        spec, limits=dataclasses.replace(spec.limits, workspace_bytes=DISK_BYTES)
    )
    name = "raw-" + secrets.token_hex(6)
    await ctx.ensure_helper_volume()
    cid = ""
    start = time.perf_counter()
    try:
        await disks.create(disk_id, DISK_BYTES, 65534, 65534)
        volume = await disks.attach(disk_id)
        request = SandboxRequest(spec, ctx.raw_owner, name, name, spec.fingerprint())
        config = container_config(
            request,
            helper_volume=HelperVolume(ctx.helper).name,
            keeper_user=ctx.keeper_user,
            workspace_volume=volume,
        )
        container = await ctx.docker.containers.create(config, name=f"sandboxd-bench-{name}")
        cid = str(container.id)
        await container.start()
        made = (time.perf_counter() - start) * 1000
        yield cid, made
    finally:
        if cid:
            await ctx.raw_remove(cid)
        with contextlib.suppress(Exception):
            await disks.delete(disk_id)


async def _sh(ctx: BenchContext, sid: str, script: str) -> None:
    resp = await ctx.stubs.processes.Run(
        process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", script], timeout=TIMEOUT)
    )
    assert resp.exit_code == 0, resp


async def _create_ms(ctx: BenchContext, **fields: Any) -> float:
    start = time.perf_counter()
    resp = await ctx.stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True), env={"SANDBOXD_BENCH": "disk"}, **fields
        )
    )
    ms = (time.perf_counter() - start) * 1000
    await ctx.delete_session(resp.session.session_id)
    return ms


async def run(ctx: BenchContext) -> dict[str, Metric]:
    small = dataclasses.replace(ctx, rounds=min(ctx.rounds, 5), warmup=min(ctx.warmup, 1))
    tiny = dataclasses.replace(ctx, rounds=min(ctx.rounds, 2), warmup=0)
    results: dict[str, Metric] = {}
    limits = common_pb2.ResourceLimits(command_timeout=TIMEOUT)

    # --- create: disk (ours, raw) and tmpfs cold in the same rounds ------------------------
    memory_cold: list[float] = []

    async def ours_create() -> float:
        memory_cold.append(await _create_ms(ctx))
        return await _create_ms(ctx, workspace=DISK_WS)

    async def raw_create() -> float:
        async with _raw_disk_container(ctx) as (_, ms):
            return ms

    ours, raw = await interleave(small, ours_create, raw_create)
    results["create_disk_session"] = latency_metric(ours, raw)
    results["create_disk_session"].extra["memory_cold_ms"] = round(
        statistics.median(memory_cold[-len(ours) :]), 3
    )

    # --- 1 GiB written and read inside ---------------------------------------------------
    async with (
        ctx.session(workspace=DISK_WS, limits=limits) as session,
        _raw_disk_container(ctx) as (cid, _),
    ):
        sid = session.session_id

        def ours_dd(script: str) -> Any:
            async def sample() -> float:
                start = time.perf_counter()
                await _sh(ctx, sid, script)
                return mb_per_s(ONE_GIB_MB, time.perf_counter() - start)

            return sample

        def raw_dd(script: str) -> Any:
            async def sample() -> float:
                start = time.perf_counter()
                code, _ = await ctx.raw_exec(cid, ["sh", "-c", script])
                assert code == 0
                return mb_per_s(ONE_GIB_MB, time.perf_counter() - start)

            return sample

        ours, raw = await interleave(tiny, ours_dd(WRITE), raw_dd(WRITE))
        results["disk_write_1gib"] = throughput_metric(ours, raw)
        ours, raw = await interleave(tiny, ours_dd(READ), raw_dd(READ))
        results["disk_read_1gib"] = throughput_metric(ours, raw)

    # --- suspend/resume and fork of 1 GiB: disk against the tar path -----------------------
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(ctx.channel)
    memory = common_pb2.ResourceLimits(
        memory_bytes=2 * GiB, workspace_bytes=GiB, command_timeout=TIMEOUT
    )
    timings: dict[str, list[float]] = {}
    for kind, fields in (
        ("disk", {"workspace": DISK_WS, "limits": limits}),
        ("tmpfs", {"limits": memory}),
    ):
        async with ctx.session(**fields) as session:
            sid = session.session_id
            await _sh(ctx, sid, WRITE.replace("count=1024", "count=1000"))  # under the tmpfs cap
            for _ in range(tiny.rounds):
                start = time.perf_counter()
                await ctx.stubs.sessions.SuspendSession(
                    session_pb2.SuspendSessionRequest(session_id=sid)
                )
                await ctx.stubs.sessions.ResumeSession(
                    session_pb2.ResumeSessionRequest(session_id=sid)
                )
                timings.setdefault(f"{kind}_suspend", []).append(
                    (time.perf_counter() - start) * 1000
                )
            for _ in range(tiny.rounds):
                start = time.perf_counter()
                snap = await snaps.CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(session_id=sid)
                )
                fork = await ctx.stubs.sessions.CreateSession(
                    session_pb2.CreateSessionRequest(
                        from_snapshot_id=snap.snapshot.snapshot_id,
                        shell=common_pb2.ShellPolicy(allow_all=True),
                        **fields,
                    )
                )
                timings.setdefault(f"{kind}_fork", []).append((time.perf_counter() - start) * 1000)
                await ctx.delete_session(fork.session.session_id)
                await snaps.DeleteSnapshot(
                    snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot.snapshot_id)
                )
    results["disk_suspend_resume_1gib"] = latency_metric(timings["disk_suspend"], None)
    results["disk_suspend_resume_1gib"].extra["tar_path_ms"] = round(
        statistics.median(timings["tmpfs_suspend"]), 3
    )
    results["disk_fork_1gib"] = latency_metric(timings["disk_fork"], None)
    results["disk_fork_1gib"].extra["tmpfs_fork_ms"] = round(
        statistics.median(timings["tmpfs_fork"]), 3
    )
    return results
