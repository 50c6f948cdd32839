"""Suspend and resume of a gVisor session: with its memory, against the filesystem suspend of
the same session.

The memory suspend needs an engine in experimental mode, so this runs its own (a private dockerd
with runsc: tests/checkpoint_engine.py) and a second sandboxd pointed at it. Two sessions: one
idle, one that touched 100 MiB (random bytes, in its tmpfs workspace: zeros would compress
to nothing in the checkpoint). Each round suspends and resumes one session with its memory, then
with the filesystem only; the filesystem round's resume starts the session's processes from
nothing, so the memory round comes first and the process is started again after each
filesystem round (untimed).

Rows: `suspend_memory_<idle|100mib>` and `resume_memory_<...>` (ours) against
`suspend_fs_<...>`/`resume_fs_<...>` as `raw`: the ratio is what keeping the memory costs
over keeping the workspace. `stored_mib` in each memory row: what a memory suspend added to the
server's store (its checkpoint, and the workspace tar where the workspace changed).
Absent (a note on stderr) where a private engine cannot run (tests/checkpoint_engine.py says
why).
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import tempfile
from pathlib import Path

import grpc
from sandboxd.v1 import common_pb2, process_pb2, process_pb2_grpc, session_pb2, session_pb2_grpc

from bench.common import BenchContext, Metric, latency_metric, timed_ms

REPO = Path(__file__).resolve().parents[1]
TOUCHED = 100 * 1024 * 1024
TOUCH = {
    "idle": "exec sleep 100000",
    # 100 MiB of random bytes in the tmpfs workspace, which is the sandbox's memory: both
    # suspends carry it (the filesystem one in its tar, the memory one in its checkpoint too).
    "100mib": "rm -f /workspace/touched"
    f" && head -c {TOUCHED} /dev/urandom > /workspace/touched.part"
    " && mv /workspace/touched.part /workspace/touched && exec sleep 100000",
}
READY = "until [ -e /workspace/touched ]; do sleep 0.2; done"
ROUNDS = 3


async def run(ctx: BenchContext) -> dict[str, Metric]:
    sys.path.insert(0, str(REPO / "tests"))
    from checkpoint_engine import CheckpointEngine, unavailable  # noqa: PLC0415

    from bench.run import running_server  # noqa: PLC0415 - run imports the bench modules

    why = unavailable()
    if why:
        print(f"[bench_suspend] skipped: {why}", file=sys.stderr)
        return {}
    engine = CheckpointEngine()
    results: dict[str, Metric] = {}
    try:
        await asyncio.to_thread(engine.start, (ctx.image,))
        with tempfile.TemporaryDirectory(prefix="sandboxd-bench-suspend-") as tmp:
            flags = ("--docker-host", engine.docker_host, "--isolation-default", "gvisor")
            async with running_server(Path(tmp) / "data", *flags) as server:
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
                sessions = session_pb2_grpc.SessionServiceStub(channel)
                processes = process_pb2_grpc.ProcessServiceStub(channel)
                for name, script in TOUCH.items():
                    results.update(
                        await _one(sessions, processes, Path(tmp) / "data", name, script)
                    )
                await channel.close()
    finally:
        await asyncio.to_thread(engine.stop)
    return results


async def _one(
    sessions: session_pb2_grpc.SessionServiceStub,
    processes: process_pb2_grpc.ProcessServiceStub,
    data_dir: Path,
    name: str,
    script: str,
) -> dict[str, Metric]:
    sid = "bench-" + secrets.token_hex(4)
    await sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            session_id=sid,
            shell=common_pb2.ShellPolicy(allow_all=True),
            isolation=common_pb2.ISOLATION_GVISOR,
            limits=common_pb2.ResourceLimits(
                memory_bytes=512 * 1024 * 1024, workspace_bytes=256 * 1024 * 1024
            ),
        )
    )

    async def start() -> None:
        req = process_pb2.StartProcessRequest(session_id=sid, argv=["sh", "-c", script])
        req.timeout.seconds = 3600
        await processes.StartProcess(req)
        if name != "idle":
            ready = process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", READY])
            ready.timeout.seconds = 120
            done = await processes.Run(ready)
            if done.exit_code != 0:
                seen = await processes.Run(
                    process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", "ls -la; df ."])
                )
                listed = await processes.ListProcesses(
                    process_pb2.ListProcessesRequest(session_id=sid)
                )
                raise RuntimeError(f"the touch did not finish: {seen} {listed}")

    async def suspend(mode: int) -> float:
        req = session_pb2.SuspendSessionRequest(session_id=sid, mode=mode)  # type: ignore[arg-type]
        return await timed_ms(lambda: sessions.SuspendSession(req))

    async def resume() -> float:
        req = session_pb2.ResumeSessionRequest(session_id=sid)
        return await timed_ms(lambda: sessions.ResumeSession(req))

    mem_s: list[float] = []
    mem_r: list[float] = []
    fs_s: list[float] = []
    fs_r: list[float] = []
    sizes: list[int] = []
    try:
        await start()
        for _ in range(ROUNDS):
            before = _stored(data_dir)
            mem_s.append(await suspend(session_pb2.SUSPEND_MODE_MEMORY))
            sizes.append(max(_stored(data_dir) - before, 0))
            mem_r.append(await resume())
            fs_s.append(await suspend(session_pb2.SUSPEND_MODE_FILESYSTEM))
            fs_r.append(await resume())
            await start()  # the filesystem resume started it from nothing
    finally:
        await sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    mib = round(max(sizes) / (1 << 20), 1)
    suspend_row, resume_row = latency_metric(mem_s, fs_s), latency_metric(mem_r, fs_r)
    suspend_row.extra["stored_mib"] = mib
    resume_row.extra["stored_mib"] = mib
    return {f"suspend_memory_{name}": suspend_row, f"resume_memory_{name}": resume_row}


def _stored(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "snapshots").glob("*.tar"))
