"""Isolation tiers side by side: CreateSession, Run(`true`) and Exec output throughput under
runc and under gVisor (runsc), each against the same operation done with aiodocker on a
container of the same profile and runtime.

Rows are `tier_<tier>_create`, `tier_<tier>_run_true`, `tier_<tier>_stream`; the gvisor rows
are absent (with a note on stderr) when the server does not offer the tier (`make gvisor`).
Creates are cold (the warm pool holds runc sessions of the default shape only).
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
import time

from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.helper_volume import HelperVolume
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.isolation import Isolation
from sandboxd.v1 import admin_pb2, common_pb2, process_pb2, session_pb2

from bench.common import (
    BenchContext,
    Metric,
    default_spec,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

STREAM_BYTES = 16_000_000
_PB = {Isolation.RUNC: common_pb2.ISOLATION_RUNC, Isolation.GVISOR: common_pb2.ISOLATION_GVISOR}
_RUNTIME = {Isolation.RUNC: "runc", Isolation.GVISOR: "runsc"}
COLD_ENV = {"SANDBOXD_BENCH": "tiers"}


async def run(ctx: BenchContext) -> dict[str, Metric]:
    info = await ctx.stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    results: dict[str, Metric] = {}
    for tier in Isolation:
        if _PB[tier] not in info.isolation_tiers:
            print(
                f"[bench_tiers] {tier.value}: not offered by the server; skipped", file=sys.stderr
            )
            continue
        results.update(await _tier(ctx, tier))
    return results


async def _tier(ctx: BenchContext, tier: Isolation) -> dict[str, Metric]:
    spec = dataclasses.replace(default_spec(ctx.image), env=COLD_ENV, isolation=tier)
    # gVisor creates take seconds: fewer rounds keep `make bench` in check.
    sub = dataclasses.replace(ctx, rounds=max(3, ctx.rounds // 3), warmup=min(ctx.warmup, 1))
    results: dict[str, Metric] = {}

    async def raw_start() -> str:
        name = "raw-" + secrets.token_hex(6)
        request = SandboxRequest(spec=spec, owner_id=ctx.raw_owner, name=name, session_id=name)
        await ctx.ensure_helper_volume()
        config = container_config(
            request,
            helper_volume=HelperVolume(ctx.helper).name,
            keeper_user=ctx.keeper_user,
            runtime=_RUNTIME[tier],
        )
        container = await ctx.docker.containers.create(config, name=f"sandboxd-bench-{name}")
        await container.start()
        return str(container.id)

    async def ours_create() -> float:
        created: list[str] = []

        async def create() -> None:
            resp = await ctx.stubs.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    shell=common_pb2.ShellPolicy(allow_all=True), env=COLD_ENV, isolation=_PB[tier]
                )
            )
            created.append(resp.session.session_id)

        ms = await timed_ms(create)
        await ctx.delete_session(created[0])
        return ms

    async def raw_create() -> float:
        ids: list[str] = []

        async def create() -> None:
            ids.append(await raw_start())

        ms = await timed_ms(create)
        await ctx.raw_remove(ids[0])
        return ms

    ours, raw = await interleave(sub, ours_create, raw_create)
    results[f"tier_{tier.value}_create"] = latency_metric(ours, raw)

    limits = common_pb2.ResourceLimits(output_bytes=16 * 1024 * 1024)
    cid = await raw_start()
    try:
        async with ctx.session(limits=limits, isolation=_PB[tier]) as session:
            sid = session.session_id

            async def ours_true() -> float:
                async def call() -> None:
                    resp = await ctx.stubs.processes.Run(
                        process_pb2.RunRequest(session_id=sid, argv=["true"])
                    )
                    assert resp.exit_code == 0, resp

                return await timed_ms(call)

            async def raw_true() -> float:
                async def call() -> None:
                    code, _ = await ctx.raw_exec(cid, ["true"])
                    assert code == 0

                return await timed_ms(call)

            ours, raw = await interleave(ctx, ours_true, raw_true)
            results[f"tier_{tier.value}_run_true"] = latency_metric(ours, raw)

            argv = ["head", "-c", str(STREAM_BYTES), "/dev/zero"]

            async def ours_stream() -> float:
                start = time.perf_counter()
                received = 0
                call = ctx.stubs.processes.Exec(process_pb2.ExecRequest(session_id=sid, argv=argv))
                async for event in call:
                    if event.HasField("output"):
                        received += len(event.output.data)
                assert received == STREAM_BYTES, received
                return mb_per_s(received, time.perf_counter() - start)

            async def raw_stream() -> float:
                start = time.perf_counter()
                code, received = await ctx.raw_exec(cid, argv)
                assert code == 0 and received == STREAM_BYTES, (code, received)
                return mb_per_s(received, time.perf_counter() - start)

            ours, raw = await interleave(sub, ours_stream, raw_stream)
            results[f"tier_{tier.value}_stream"] = throughput_metric(ours, raw)
    finally:
        await ctx.raw_remove(cid)
    return results
