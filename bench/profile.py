"""Profile the server under one benchmark's load: py-spy samples the real server process.

    .venv/bin/python bench/profile.py exec_stream --seconds 20 --output /tmp/exec.txt

Starts a server like `make bench` does, runs the operation in a loop, and has py-spy record the
server (needs ptrace: root, or kernel.yama.ptrace_scope=0). The output is py-spy's "raw" format
(collapsed stacks, one line each, the sample count last): sort by count, or feed it to a flame
graph tool. `--top` prints the hottest leaf functions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandboxd.v1 import common_pb2, process_pb2, session_pb2  # noqa: E402

from bench.run import HELPER, IMAGE, KEEPER_USER, POOL_SIZE, running_server  # noqa: E402


async def _load(args: argparse.Namespace) -> None:
    import grpc

    from bench.common import BenchContext, Stubs
    from bench.run import _docker

    with tempfile.TemporaryDirectory(prefix="sandboxd-profile-") as tmp:
        async with (
            running_server(Path(tmp), "--pool-size", str(POOL_SIZE)) as server,
            _docker() as docker,
        ):
            channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{server.port}",
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
            )
            from sandboxd.v1 import (
                admin_pb2_grpc,
                filesystem_pb2_grpc,
                process_pb2_grpc,
                session_pb2_grpc,
            )

            ctx = BenchContext(
                address=f"127.0.0.1:{server.port}",
                channel=channel,
                stubs=Stubs(
                    session_pb2_grpc.SessionServiceStub(channel),
                    process_pb2_grpc.ProcessServiceStub(channel),
                    filesystem_pb2_grpc.FilesystemServiceStub(channel),
                    admin_pb2_grpc.AdminServiceStub(channel),
                ),
                docker=docker,
                image=IMAGE,
                helper=HELPER,
                keeper_user=KEEPER_USER,
                raw_owner="profile",
                metrics_url=f"http://127.0.0.1:{server.metrics_port}/metrics",
                pool_size=POOL_SIZE,
            )
            limits = common_pb2.ResourceLimits(output_bytes=16 * 1024 * 1024)
            if args.operation in ("import_archive", "export_archive"):
                # bench_archive's shape: room for the new tree beside the old one (a default
                # 64 MiB workspace would profile the replace's empty-then-unpack-again path)
                limits.workspace_bytes = 128 * 1024 * 1024
                limits.memory_bytes = 512 * 1024 * 1024
            async with ctx.session(limits=limits) as s, contextlib.AsyncExitStack() as stack:
                sid = s.session_id

                async def exec_stream() -> None:
                    argv = ["head", "-c", "16000000", "/dev/zero"]
                    req = process_pb2.ExecRequest(session_id=sid, argv=argv)
                    async for _ in ctx.stubs.processes.Exec(req):
                        pass

                async def run_true() -> None:
                    await ctx.stubs.processes.Run(
                        process_pb2.RunRequest(session_id=sid, argv=["true"])
                    )

                async def create() -> None:
                    resp = await ctx.stubs.sessions.CreateSession(
                        session_pb2.CreateSessionRequest(env={"P": "1"})
                    )
                    await ctx.delete_session(resp.session.session_id)

                async def import_archive() -> None:
                    from sandboxd.v1 import snapshot_pb2_grpc

                    from bench import archive_mix, bench_archive

                    if not archive:
                        await bench_archive._fill_session(ctx, sid)
                        snaps = snapshot_pb2_grpc.SnapshotServiceStub(channel)
                        archive.append(await archive_mix.export_bytes(snaps, sid))
                    await snapshot_pb2_grpc.SnapshotServiceStub(channel).ImportArchive(
                        archive_mix.import_requests(sid, archive[0])
                    )

                from bench import bench_processes

                async def export_archive() -> None:
                    from sandboxd.v1 import snapshot_pb2_grpc

                    from bench import archive_mix, bench_archive

                    if not archive:
                        await bench_archive._fill_session(ctx, sid)
                        archive.append(b"filled")
                    snaps = snapshot_pb2_grpc.SnapshotServiceStub(channel)
                    await archive_mix.export_count(snaps, sid)

                async def interact_stream() -> None:
                    await bench_processes._interact_stream(ctx, sid)

                async def attach_stream() -> None:
                    await bench_processes._attach_stream(ctx, sid)

                archive: list[bytes] = []
                if args.operation in ("import_archive", "export_archive"):
                    # fill (and export) before sampling starts
                    fill = import_archive if args.operation == "import_archive" else export_archive
                    await fill()
                ops: dict[str, Callable[[], Awaitable[None]]] = {
                    "import_archive": import_archive,
                    "export_archive": export_archive,
                    "exec_stream": exec_stream,
                    "interact_stream": interact_stream,
                    "attach_stream": attach_stream,
                    "run_true": run_true,
                    "create_cold": create,
                }
                if args.operation == "interact_round_trip":
                    echo = await stack.enter_async_context(bench_processes.interact_echo(ctx, sid))

                    async def round_trip() -> None:
                        await echo()

                    ops["interact_round_trip"] = round_trip
                op = ops[args.operation]
                spy = await asyncio.create_subprocess_exec(
                    shutil.which("py-spy") or str(REPO / ".venv" / "bin" / "py-spy"),
                    "record",
                    "--pid",
                    str(server.proc.pid),
                    "--duration",
                    str(args.seconds),
                    "--format",
                    "raw",
                    "--rate",
                    "250",
                    "--output",
                    args.output,
                    *(["--native"] if args.native else [] if args.blocking else ["--nonblocking"]),
                    *(["--threads"] if args.threads else []),
                    *(["--gil"] if args.gil else []),
                )
                deadline = time.monotonic() + args.seconds
                count = 0

                async def caller() -> None:
                    nonlocal count
                    while time.monotonic() < deadline:
                        await op()
                        count += 1

                async with asyncio.TaskGroup() as tg:
                    for _ in range(args.callers):
                        tg.create_task(caller())
                await spy.wait()
                print(f"{count} x {args.operation} in {args.seconds} s", file=sys.stderr)
            await channel.close()


def top(path: str, n: int) -> None:
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        leaves[frames[-1]] += int(count)
        total += int(count)
    for frame, count in leaves.most_common(n):
        print(f"{100 * count / max(total, 1):5.1f}%  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "operation",
        choices=[
            "exec_stream",
            "interact_stream",
            "attach_stream",
            "interact_round_trip",
            "run_true",
            "create_cold",
            "import_archive",
            "export_archive",
        ],
    )
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--callers", type=int, default=1, help="concurrent loops of the operation")
    parser.add_argument("--output", default="/tmp/sandboxd-profile.txt")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--native", action="store_true", help="C frames too (py-spy pauses the server to sample)"
    )
    parser.add_argument(
        "--blocking", action="store_true", help="pause the server per sample (whole stacks)"
    )
    parser.add_argument("--threads", action="store_true", help="the thread id as the first frame")
    parser.add_argument(
        "--gil", action="store_true", help="only samples that hold the GIL (busy, not waiting)"
    )
    args = parser.parse_args()
    asyncio.run(_load(args))
    top(args.output, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
