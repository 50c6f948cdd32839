"""Templates: a trivial build on a cached base, and CreateSession from a built template.

build_template_cached_base: BuildTemplate of a two-line Dockerfile on top of the `python`
template (busybox where the python image is absent) against the same build straight on the
engine (`POST /build`, same context, no cache), round by round. Each of our builds carries its
own build label, so its steps are never served from cache: the raw side is built with
`nocache` to compare like with like.

create_session_from_template: CreateSession(template = a built template) against
CreateSession with the server's default image, both then deleted.
"""

from __future__ import annotations

import io
import secrets
import subprocess
import tarfile

from sandboxd.v1 import common_pb2, session_pb2, template_pb2, template_pb2_grpc

from bench.common import BenchContext, Metric, interleave, latency_metric, timed_ms

BUILD_ROUNDS = 5
PYTHON_IMAGE = "sandboxd-runtime:python"


def _has_image(image: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    return done.returncode == 0


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def run(ctx: BenchContext) -> dict[str, Metric]:
    stub = template_pb2_grpc.TemplateServiceStub(ctx.channel)
    base, image = ("python", PYTHON_IMAGE) if _has_image(PYTHON_IMAGE) else ("busybox", ctx.image)
    body = "RUN echo hi > /hi\n"
    names: list[str] = []
    raw_tags: list[str] = []

    async def ours_build() -> float:
        name = "bench-" + secrets.token_hex(4)
        names.append(name)

        async def requests():  # type: ignore[no-untyped-def]
            yield template_pb2.BuildTemplateRequest(
                spec=template_pb2.TemplateSpec(name=name, dockerfile=f"FROM {base}\n{body}")
            )

        async def call() -> None:
            async for _ in stub.BuildTemplate(requests()):
                pass

        return await timed_ms(call)

    async def raw_build() -> float:
        tag = "sandboxd-bench-raw:" + secrets.token_hex(4)
        raw_tags.append(tag)
        context = _tar({"Dockerfile": f"FROM {image}\n{body}".encode()})

        async def call() -> None:
            await ctx.docker.images.build(
                fileobj=io.BytesIO(context), encoding="identity", tag=tag, nocache=True, rm=True
            )

        return await timed_ms(call)

    rounds, warmup = ctx.rounds, ctx.warmup
    ctx.rounds, ctx.warmup = BUILD_ROUNDS, 1
    try:
        ours, raw = await interleave(ctx, ours_build, raw_build)
    finally:
        ctx.rounds, ctx.warmup = rounds, warmup
    built = names[-1]

    async def create(**fields: object) -> float:
        ids: list[str] = []

        async def call() -> None:
            resp = await ctx.stubs.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    shell=common_pb2.ShellPolicy(allow_all=True),
                    **fields,  # type: ignore[arg-type]
                )
            )
            ids.append(resp.session.session_id)

        ms = await timed_ms(call)
        await ctx.stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=ids[0]))
        return ms

    async def from_template() -> float:
        return await create(template=built)

    async def default() -> float:
        return await create()

    t_ours, t_raw = await interleave(ctx, from_template, default)
    for name in names:
        await stub.DeleteTemplate(template_pb2.DeleteTemplateRequest(name=name))
    for tag in raw_tags:
        subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)
    build = latency_metric(ours, raw)
    build.extra["base"] = base
    return {
        "build_template_cached_base": build,
        # raw: our own create of the default image, which the warm pool may serve.
        "create_session_from_template": latency_metric(t_ours, t_raw),
    }
