"""Images from a registry: what the digest check of PULL_POLICY_ALWAYS costs a create.

A private registry on loopback (tests/registryutil.py: Debian's docker-registry, htpasswd
auth) holds the runtime image; a second sandboxd, allowed to use it and given the credentials,
has pulled it once. Then, round by round: CreateSession with PULL_POLICY_ALWAYS (one manifest
request to the registry, no pull: nothing moved) against the same create with the default
IF_NOT_PRESENT (the image is present: no registry traffic at all), both on a shape the warm pool
does not hold. Create from a present image is bench_core's create_session_cold.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
from sandboxd.v1 import common_pb2, images_pb2, session_pb2, session_pb2_grpc

from bench.common import BenchContext, Metric, interleave, latency_metric, timed_ms

REPO = Path(__file__).resolve().parents[1]


async def run(ctx: BenchContext) -> dict[str, Metric]:
    sys.path.insert(0, str(REPO / "tests"))
    from registryutil import start_registry  # noqa: PLC0415 - tests/ is not a package

    from bench.run import running_server  # noqa: PLC0415 - run imports the bench modules

    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-registry-") as tmp:
        reg = await asyncio.to_thread(start_registry, Path(tmp) / "reg")
        ref = f"{reg.host}/rt:bench"
        try:
            await asyncio.to_thread(reg.push, ctx.image, "rt:bench")
            auth = reg.write_auth(Path(tmp) / "auth.json", reg.password)
            flags = ("--image-allowlist", f"{reg.host}/rt*", "--registry-auth-file", str(auth))
            async with running_server(Path(tmp) / "data", *flags) as server:
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
                stub = session_pb2_grpc.SessionServiceStub(channel)

                async def create(policy: int) -> float:
                    ids: list[str] = []

                    async def call() -> None:
                        resp = await stub.CreateSession(
                            session_pb2.CreateSessionRequest(
                                image=ref,
                                pull_policy=policy,  # type: ignore[arg-type]
                                shell=common_pb2.ShellPolicy(allow_all=True),
                            )
                        )
                        ids.append(resp.session.session_id)

                    ms = await timed_ms(call)
                    await stub.DeleteSession(session_pb2.DeleteSessionRequest(session_id=ids[0]))
                    return ms

                await create(images_pb2.PULL_POLICY_IF_NOT_PRESENT)  # the one pull, untimed

                async def always() -> float:
                    return await create(images_pb2.PULL_POLICY_ALWAYS)

                async def present() -> float:
                    return await create(images_pb2.PULL_POLICY_IF_NOT_PRESENT)

                ours, raw = await interleave(ctx, always, present)
                await channel.close()
        finally:
            await asyncio.to_thread(reg.stop)
            subprocess.run(["docker", "rmi", ref], capture_output=True, check=False)
    # Raw here is our own create without the check: the ratio is the check's overhead.
    return {"create_always_digest_check": latency_metric(ours, raw)}
