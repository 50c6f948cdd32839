"""Disk workspaces (docs/workspaces.md): create, 1 GiB in and out, suspend/resume and fork.

Metrics (names owned by this module):
- `create_disk_session`: p50 ms of CreateSession of a disk workspace (10 GiB, sparse), against
  raw: the same disk made with the server's own disk code (`DockerDisks`, the tool container)
  plus a create+start of the same container profile mounting it. Extra `memory_cold_ms`: a
  cold tmpfs CreateSession in the same rounds.
- `create_disk_session_pool`: p50 ms of CreateSession served by the warm pool of a second
  server whose default storage is disk (each member has its disk made), against the same raw
  disk and container; extras `memory_pool_ms` (a tmpfs pool hit of the main server) and
  `cold_ms` (the cold disk create above).
- `disk_write_1gib`, `disk_read_1gib`: MB/s of `dd` writing (fsync) and reading 1 GiB in the
  session's disk workspace, against the same `dd` exec'd in the raw container on its own disk.
- `disk_suspend_resume_1gib`: p50 ms of SuspendSession + ResumeSession of a session holding
  1 GiB on disk (the disk stays: no tar); extra `tar_path_ms`, the same for a tmpfs session
  holding 1 GiB (the snapshot's tar round trip).
- `disk_fork_1gib`: p50 ms of CreateSnapshot + CreateSession(from_snapshot_id) of that disk
  session (a disk snapshot: two sparse copies on the engine host, no tar); extras
  `tar_path_ms` for the tmpfs one and `disk_tar_path_ms` for the same disk session through a
  TAR snapshot (what a disk fork cost before), and `disk_snapshot_ms`/`disk_tar_snapshot_ms`,
  the CreateSnapshot alone.

One round each for those two (a GiB or two moves per round); a call that fails is reported in
the row's `failed`, and the rest is still measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2
from sandboxd.engine.docker_errors import translate_errors
from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.helper_volume import HelperVolume
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.models import WorkspaceStorage
from sandboxd.storage.docker_disks import DockerDisks
from sandboxd.v1 import (
    common_pb2,
    process_pb2,
    session_pb2,
    session_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

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


async def _create_ms(ctx: BenchContext, *, warm: bool = False, **fields: Any) -> float:
    """A create and its delete; `warm`: the default shape, which the pool serves (else an
    environment of its own keeps it a cold create)."""
    env = {} if warm else {"SANDBOXD_BENCH": "disk"}
    start = time.perf_counter()
    resp = await ctx.stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True), env=env, **fields
        )
    )
    ms = (time.perf_counter() - start) * 1000
    await ctx.delete_session(resp.session.session_id)
    return ms


async def run(ctx: BenchContext) -> dict[str, Metric]:
    small = dataclasses.replace(ctx, rounds=min(ctx.rounds, 3), warmup=min(ctx.warmup, 1))
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
    results["create_disk_session_pool"] = await _pool_create(ctx, small, ours)

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
    timings: dict[str, list[float]] = {
        "disk_suspend": [],
        "tmpfs_suspend": [],
        "disk_fork": [],
        "tmpfs_fork": [],
        "disk_tar_fork": [],
        "disk_snapshot": [],
        "disk_tar_snapshot": [],
        "tmpfs_snapshot": [],
    }
    failed: dict[str, str] = {}
    tar = snapshot_pb2.SNAPSHOT_KIND_TAR
    for kind, fields, snap_kind in (
        ("disk", {"workspace": DISK_WS, "limits": limits}, snapshot_pb2.SNAPSHOT_KIND_UNSPECIFIED),
        ("disk_tar", {"workspace": DISK_WS, "limits": limits}, tar),
        ("tmpfs", {"limits": memory}, snapshot_pb2.SNAPSHOT_KIND_UNSPECIFIED),
    ):
        async with ctx.session(**fields) as session:
            sid = session.session_id
            await _sh(ctx, sid, WRITE.replace("count=1024", "count=1000"))  # under the tmpfs cap
            try:
                if kind == "disk_tar":
                    raise _Skip  # its suspend is the disk row's

                start = time.perf_counter()
                await ctx.stubs.sessions.SuspendSession(
                    session_pb2.SuspendSessionRequest(session_id=sid)
                )
                await ctx.stubs.sessions.ResumeSession(
                    session_pb2.ResumeSessionRequest(session_id=sid)
                )
                timings[f"{kind}_suspend"].append((time.perf_counter() - start) * 1000)
            except grpc.RpcError as exc:  # reported with the row, the rest still measured
                failed[f"{kind}_suspend"] = f"{exc.code().name}: {exc.details()}"
            except _Skip:
                pass
            snap_id = ""
            try:
                start = time.perf_counter()
                snap = await snaps.CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=snap_kind)
                )
                timings[f"{kind}_snapshot"].append((time.perf_counter() - start) * 1000)
                snap_id = snap.snapshot.snapshot_id
                fork = await ctx.stubs.sessions.CreateSession(
                    session_pb2.CreateSessionRequest(
                        from_snapshot_id=snap_id,
                        shell=common_pb2.ShellPolicy(allow_all=True),
                        **fields,
                    )
                )
                timings[f"{kind}_fork"].append((time.perf_counter() - start) * 1000)
                await ctx.delete_session(fork.session.session_id)
            except grpc.RpcError as exc:
                failed[f"{kind}_fork"] = f"{exc.code().name}: {exc.details()}"
            finally:
                if snap_id:
                    await snaps.DeleteSnapshot(
                        snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap_id)
                    )
    for name, key, other in (
        ("disk_suspend_resume_1gib", "disk_suspend", "tmpfs_suspend"),
        ("disk_fork_1gib", "disk_fork", "tmpfs_fork"),
    ):
        if timings[key]:
            results[name] = latency_metric(timings[key], None)
            results[name].extra["tar_path_ms"] = (
                round(statistics.median(timings[other]), 3) if timings[other] else None
            )
            if failed:
                results[name].extra["failed"] = {
                    k: v for k, v in failed.items() if k in (key, other)
                }
    if "disk_fork_1gib" in results:
        extra = results["disk_fork_1gib"].extra
        for label, key in (
            ("disk_tar_path_ms", "disk_tar_fork"),
            ("disk_snapshot_ms", "disk_snapshot"),
            ("disk_tar_snapshot_ms", "disk_tar_snapshot"),
            ("tmpfs_snapshot_ms", "tmpfs_snapshot"),
        ):
            extra[label] = round(statistics.median(timings[key]), 3) if timings[key] else None
        if "disk_tar_fork" in failed:
            extra.setdefault("failed", {})["disk_tar_fork"] = failed["disk_tar_fork"]
    return results


class _Skip(Exception):
    """A step this kind does not measure."""


async def _pool_create(ctx: BenchContext, small: BenchContext, cold: list[float]) -> Metric:
    """Creates served by the warm pool of a server whose default storage is disk."""
    from bench.run import running_server  # noqa: PLC0415 - run imports the bench modules

    pool_size = 2
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-diskpool-") as tmp:
        async with running_server(
            Path(tmp),
            "--pool-size",
            str(pool_size),
            "--default-workspace-storage",
            "disk",
            "--default-disk-bytes",
            str(DISK_BYTES),
        ) as server:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
            pooled = dataclasses.replace(
                small,
                address=f"127.0.0.1:{server.port}",
                channel=channel,
                stubs=dataclasses.replace(
                    ctx.stubs, sessions=session_pb2_grpc.SessionServiceStub(channel)
                ),
                metrics_url=f"http://127.0.0.1:{server.metrics_port}/metrics",
                pool_size=pool_size,
            )
            memory_pool: list[float] = []
            try:

                async def ours() -> float:
                    await ctx.pool_ready()
                    memory_pool.append(await _create_ms(ctx, warm=True))  # a tmpfs pool hit
                    await pooled.pool_ready(timeout=120)
                    return await _create_ms(pooled, warm=True)

                async def raw() -> float:
                    async with _raw_disk_container(ctx) as (_, ms):
                        return ms

                mine, theirs = await interleave(small, ours, raw)
            finally:
                await channel.close()
    metric = latency_metric(mine, theirs)
    metric.extra["memory_pool_ms"] = round(statistics.median(memory_pool), 3)
    metric.extra["cold_ms"] = round(statistics.median(cold), 3) if cold else None
    return metric
