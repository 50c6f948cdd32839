"""The audit log's cost on the hot path: Run(`true`) on the server under test (audit on, the
default) against the same call on a second server with `--audit-enabled false`.

Here the "raw" column is that audit-off server, not aiodocker: the row's target (ratio at most
1.05) is the audit log's promise, "within 5% of the same run with it off". Both servers run
the same code and profile on the same engine; rounds alternate which goes first, so drift hits
both sides alike.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import grpc
from sandboxd.v1 import common_pb2, process_pb2, process_pb2_grpc, session_pb2, session_pb2_grpc

from bench.common import BenchContext, Metric, interleave, latency_metric, timed_ms


async def run(ctx: BenchContext) -> dict[str, Metric]:
    from bench.run import running_server  # the runner's own way of starting a server

    limits = common_pb2.ResourceLimits(output_bytes=16 * 1024 * 1024)
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-noaudit-") as tmp:
        async with (
            running_server(Path(tmp), "--audit-enabled", "false") as off_server,
            grpc.aio.insecure_channel(f"127.0.0.1:{off_server.port}") as channel,
            ctx.session(limits=limits) as session,
        ):
            off_sessions = session_pb2_grpc.SessionServiceStub(channel)
            off_processes = process_pb2_grpc.ProcessServiceStub(channel)
            created = await off_sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    shell=common_pb2.ShellPolicy(allow_all=True), limits=limits
                )
            )
            off_sid = created.session.session_id
            try:

                async def audit_on() -> float:
                    async def call() -> None:
                        resp = await ctx.stubs.processes.Run(
                            process_pb2.RunRequest(session_id=session.session_id, argv=["true"])
                        )
                        assert resp.exit_code == 0, resp

                    return await timed_ms(call)

                async def audit_off() -> float:
                    async def call() -> None:
                        resp = await off_processes.Run(
                            process_pb2.RunRequest(session_id=off_sid, argv=["true"])
                        )
                        assert resp.exit_code == 0, resp

                    return await timed_ms(call)

                on, off = await interleave(ctx, audit_on, audit_off)
            finally:
                with contextlib.suppress(grpc.RpcError):
                    await off_sessions.DeleteSession(
                        session_pb2.DeleteSessionRequest(session_id=off_sid)
                    )
    return {"run_true_audit": latency_metric(on, off)}
