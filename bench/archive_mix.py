"""The content mix of bench_archive: a compressible source tree next to random bytes, each moved
as a plain tar and compressed (zstd), both ways, each against raw `tar` over a docker exec.

Why both contents: random bytes are what a transfer's own cost shows on (nothing to gain from
compression, every byte crosses every hop), a source tree is what callers move most (zstd makes
its bytes on the wire a fraction of the tar). Why raw is always a plain tar: that is what a
caller gets from the engine itself; compression is the server's way to beat it, so the ratio
is of the same content moved, in MB/s of the uncompressed tar, and `wire_bytes` next to it says
what crossed gRPC.

The tree is generated here, the same for every run (seeded): many small files of source-like
lines (identifiers, calls, comments, indentation) from a fixed pool, so zstd's level 1 finds
about as much to take out as in a real checkout. It is imported into the source session and
the raw container before anything is timed.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import statistics
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxd.v1 import snapshot_pb2, snapshot_pb2_grpc

from bench.common import BenchContext, Metric, interleave, mb_per_s, throughput_metric

TREE_FILES = 1600
TREE_LINES_PER_FILE = (120, 780)  # uniform: files of about 4 to 32 KiB, some 32 MiB in all
IMPORT_CHUNK = 256 * 1024
PLAIN = snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED
ZSTD = snapshot_pb2.ARCHIVE_COMPRESSION_ZSTD

_WORDS = (
    "self", "return", "value", "data", "name", "path", "items", "result", "config", "session",
    "request", "reply", "stream", "chunk", "offset", "limit", "count", "index", "error", "state",
)  # fmt: skip


def _line_pool(rng: random.Random) -> list[str]:
    idents = [
        rng.choice(_WORDS) + "_" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=4))
        for _ in range(2000)
    ] + list(_WORDS)
    shapes = (
        "{i}{a} = {b}({c}, {d})",
        "{i}if {a} is not None and {b} > {n}:",
        "{i}return {a}.{b}({c})",
        "{i}for {a} in {b}:",
        "{i}# {a} {b} {c}: the {d} of {e}, kept for {n} rounds",
        "{i}def {a}(self, {b}: int = {n}) -> {c}:",
        '{i}raise ValueError(f"{a} {{{b}}} is not {c}")',
        "{i}{a}.{b} += {n}",
        "",
    )
    pool = []
    for _ in range(24000):
        picks = {k: rng.choice(idents) for k in "abcde"}
        pool.append(
            rng.choice(shapes).format(i="    " * rng.randint(0, 3), n=rng.randint(0, 4096), **picks)
        )
    return pool


def tree_tar(seed: int = 7) -> bytes:
    """The compressible tree as a tar: the same bytes for the same seed, owned by 65534."""
    rng = random.Random(seed)
    pool = _line_pool(rng)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs: set[str] = set()
        for n in range(TREE_FILES):
            folder = f"src/pkg{n // 100:02d}/sub{n % 7}"
            for d in (f"src/pkg{n // 100:02d}", folder):
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_info(d, 0, tarfile.DIRTYPE, 0o755))
            body = "\n".join(rng.choices(pool, k=rng.randint(*TREE_LINES_PER_FILE))).encode()
            tar.addfile(_info(f"{folder}/mod{n:04d}.py", len(body)), io.BytesIO(body))
    return out.getvalue()


def _info(
    name: str, size: int, kind: bytes = tarfile.REGTYPE, mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.mtime = size, kind, mode, 1_700_000_000
    info.uid = info.gid = 65534
    return info


async def export_bytes(
    snaps: snapshot_pb2_grpc.SnapshotServiceStub, session_id: str, compression: int = PLAIN
) -> bytes:
    parts: list[bytes] = []
    request = snapshot_pb2.ExportArchiveRequest(session_id=session_id, compression=compression)
    async for reply in snaps.ExportArchive(request):
        parts.append(reply.chunk.data)
    return b"".join(parts)


async def export_count(
    snaps: snapshot_pb2_grpc.SnapshotServiceStub, session_id: str, compression: int = PLAIN
) -> int:
    """Bytes on the wire of one export, counted as they stream (nothing kept, like raw)."""
    n = 0
    request = snapshot_pb2.ExportArchiveRequest(session_id=session_id, compression=compression)
    async for reply in snaps.ExportArchive(request):
        n += len(reply.chunk.data)
    return n


def import_requests(
    session_id: str, archive: bytes, compression: int = PLAIN
) -> Iterator[snapshot_pb2.ImportArchiveRequest]:
    yield snapshot_pb2.ImportArchiveRequest(
        header=snapshot_pb2.ImportArchiveHeader(
            session_id=session_id, replace=True, compression=compression
        )
    )
    view = memoryview(archive)
    for i in range(0, len(archive), IMPORT_CHUNK):
        yield snapshot_pb2.ImportArchiveRequest(data=bytes(view[i : i + IMPORT_CHUNK]))


async def raw_import(ctx: BenchContext, container_id: str, archive: bytes) -> None:
    """`tar -x` fed over the exec's stdin, as a caller with aiodocker would do it."""
    container = ctx.docker.containers.container(container_id)
    execution = await container.exec(
        ["tar", "-x", "-o", "-f", "-", "-C", "/workspace"], user="65534:65534", stdin=True
    )
    async with execution.start(detach=False) as stream:
        view = memoryview(archive)
        for i in range(0, len(archive), IMPORT_CHUNK):
            await stream.write_in(bytes(view[i : i + IMPORT_CHUNK]))
        resp = stream._resp
        transport = resp.connection.transport if resp and resp.connection else None
        if transport is not None:
            transport.write_eof()
        while await stream.read_out() is not None:
            pass
    for delay in (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2):
        if delay:
            await asyncio.sleep(delay)
        info = await execution.inspect()
        if not info.get("Running"):
            assert info.get("ExitCode") == 0, "raw tar -x failed"
            return


@dataclass
class Content:
    """One content, where it lives on each side, and its archives (taken once, untimed)."""

    label: str  # "random" or "tree"
    session_id: str  # the source session holding it
    raw_id: str  # the raw container holding it, in /workspace
    plain: bytes = b""  # our plain export of it: the tar both sides move
    zstd: bytes = b""  # our zstd export of it: what a compressed import sends


def _metric(ours: list[float], raw: list[float], extra: dict[str, object]) -> Metric:
    m = throughput_metric(ours, raw)
    m.extra.update(extra)
    return m


_TICK = os.sysconf("SC_CLK_TCK")


def server_cpu_s(pid: int) -> float:
    """User plus system CPU of the server so far (0 when unknown): per call, the figure that a
    loaded machine leaves comparable where wall-clock MB/s is not."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


async def measure(
    ctx: BenchContext,
    snaps: snapshot_pb2_grpc.SnapshotServiceStub,
    content: Content,
    dst_session: str,
) -> dict[str, Metric]:
    """Export and import of `content`, plain and zstd, each interleaved with raw tar."""
    content.plain = await export_bytes(snaps, content.session_id)
    content.zstd = await export_bytes(snaps, content.session_id, ZSTD)
    size = len(content.plain)
    raw_out = [0]

    async def raw_export() -> float:
        start = time.perf_counter()
        code, raw_out[0] = await ctx.raw_exec(
            content.raw_id, ["tar", "-c", "-f", "-", "-C", "/workspace", "."]
        )
        assert code == 0, "raw tar -c failed"
        return mb_per_s(raw_out[0], time.perf_counter() - start)

    async def raw_in() -> float:
        start = time.perf_counter()
        await raw_import(ctx, content.raw_id, content.plain)
        return mb_per_s(size, time.perf_counter() - start)

    results: dict[str, Metric] = {}
    for compression, tag in ((PLAIN, ""), (ZSTD, "_zstd")):
        wire = [0]
        cpu: list[float] = []  # the server's CPU per call of ours, warm-up included

        async def ours_export(
            compression: int = compression, wire: list[int] = wire, cpu: list[float] = cpu
        ) -> float:
            cpu0, start = server_cpu_s(ctx.server_pid), time.perf_counter()
            wire[0] = await export_count(snaps, content.session_id, compression)
            seconds = time.perf_counter() - start
            cpu.append(server_cpu_s(ctx.server_pid) - cpu0)
            return mb_per_s(size, seconds)  # MB/s of the tar it carries

        payload = content.plain if compression == PLAIN else content.zstd

        async def ours_import(
            compression: int = compression, payload: bytes = payload, cpu: list[float] = cpu
        ) -> float:
            cpu0, start = server_cpu_s(ctx.server_pid), time.perf_counter()
            await snaps.ImportArchive(import_requests(dst_session, payload, compression))
            seconds = time.perf_counter() - start
            cpu.append(server_cpu_s(ctx.server_pid) - cpu0)
            return mb_per_s(size, seconds)

        for direction, ours_fn, raw_fn, on_wire in (
            ("export", ours_export, raw_export, lambda w=wire: w[0]),
            ("import", ours_import, raw_in, lambda p=payload: len(p)),
        ):
            cpu.clear()
            ours, theirs = await interleave(ctx, ours_fn, raw_fn)
            measured = cpu[ctx.warmup :]
            results[metric_name(direction, content.label, tag)] = _metric(
                ours,
                theirs,
                {
                    "content": content.label,
                    "compression": "zstd" if tag else "none",
                    "tar_bytes": size,
                    "wire_bytes": on_wire(),
                    "raw_wire_bytes": raw_out[0] or size,
                    "server_cpu_ms": round(statistics.median(measured) * 1000)
                    if measured
                    else None,
                },
            )
    return results


def metric_name(direction: str, label: str, tag: str) -> str:
    """`export_throughput` for random bytes as a plain tar (the row's name before the mix),
    else e.g. `export_tree_zstd_throughput`."""
    if label == "random" and not tag:
        return f"{direction}_throughput"
    return f"{direction}_{label}{tag}_throughput"
