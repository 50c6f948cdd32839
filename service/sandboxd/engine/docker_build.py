"""Image builds on the Docker Engine API (the Docker adapter's part of templates).

The classic builder (`POST /build`, asked for by `version=1` so that a daemon whose default
moves to BuildKit does not bring its frontends, heredocs, `RUN --mount` or `--network` with
it) runs each step in a container with the limits given here: network `none`, a memory cap
without swap, a CPU quota. Intermediate containers are always removed (`forcerm`);
intermediate images are removed by `prune_images` with the build's own label, which the
caller's Dockerfile carries from its first step on. The engine offers no disk limit for a
build (`--storage-opt size` needs overlay2 on xfs with project quotas, and `POST /build` takes
none), so `usage` measures what the build has made so far for the caller to stop it by, and
each step runs with RLIMIT_FSIZE (`ulimits`), which bounds any one file a step writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.jsonstream import json_stream_stream

from sandboxd.engine.protocol import BuildLimits
from sandboxd.errors import EngineUnavailable, FailedPrecondition
from sandboxd.reasons import Reason

CHUNK = 256 * 1024
CPU_PERIOD_US = 100_000


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    """The context tar, read off the loop a chunk at a time (never whole in memory)."""
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk


def build_params(
    dockerfile: str, tag: str, labels: Mapping[str, str], limits: BuildLimits
) -> dict[str, str]:
    params = {
        "t": tag,
        "version": "1",
        "dockerfile": dockerfile,
        "rm": "1",
        "forcerm": "1",
        "pull": "0",
        "networkmode": "none",
        "memory": str(limits.memory_bytes),
        "memswap": str(limits.memory_bytes),
        "cpuperiod": str(CPU_PERIOD_US),
        "cpuquota": str(max(1000, limits.millicpus * CPU_PERIOD_US // 1000)),
        "labels": json.dumps(dict(labels)),
    }
    if limits.file_bytes:
        n = limits.file_bytes
        params["ulimits"] = json.dumps([{"Name": "fsize", "Soft": n, "Hard": n}])
    return params


async def build(
    docker: aiodocker.Docker,
    context: Path,
    *,
    dockerfile: str,
    tag: str,
    labels: Mapping[str, str],
    limits: BuildLimits,
) -> AsyncGenerator[str, None]:
    """Yield the build's log lines; a failed step is FailedPrecondition TEMPLATE_BUILD_FAILED."""
    params = build_params(dockerfile, tag, labels, limits)
    try:
        async with docker._query(
            "build",
            "POST",
            params=params,
            headers={"content-type": "application/x-tar"},
            data=_file_chunks(context),
            timeout=docker._resolve_long_running_timeout(None),
        ) as response:
            async for item in json_stream_stream(response):
                for line in _lines(item):
                    yield line
    except aiodocker.exceptions.DockerStreamError as e:
        raise FailedPrecondition(
            f"the build failed: {str(e.message)[:500]}",
            reason=Reason.TEMPLATE_BUILD_FAILED,
        ) from e
    except aiodocker.DockerError as e:
        if e.status >= 500 and "connect" in str(e.message).lower():
            raise EngineUnavailable(f"building {tag}: the engine does not answer") from e
        raise FailedPrecondition(
            f"the engine refused the build: {str(e.message)[:500]}",
            reason=Reason.TEMPLATE_BUILD_FAILED,
        ) from e
    except OSError as e:
        raise EngineUnavailable(f"building {tag}: the engine does not answer ({e})") from e


def _lines(item: Mapping[str, Any]) -> list[str]:
    text = item.get("stream")
    if not isinstance(text, str):
        return []
    return [line[:1000] for line in text.splitlines() if line.strip()]


async def prune(docker: aiodocker.Docker, labels: Mapping[str, str]) -> None:
    """Remove the containers and images carrying all of `labels`. A build's step containers
    carry them too (a container inherits its image's labels), so a step still running after
    its build was abandoned is ended here rather than left to commit."""
    wanted = [f"{k}={v}" for k, v in labels.items()]
    steps = await docker.containers.list(all=True, filters={"label": wanted})
    for container in steps:
        with contextlib.suppress(aiodocker.DockerError):
            await container.delete(force=True)
    filters = {"label": wanted, "dangling": ["false"]}
    async with docker._query(
        "images/prune", "POST", params={"filters": json.dumps(filters)}
    ) as response:
        await response.read()


async def usage(docker: aiodocker.Docker, labels: Mapping[str, str]) -> int:
    """The largest image or step container root filesystem carrying all of `labels`."""
    filters = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
    made = await docker._query_json("images/json", params={"all": "1", "filters": filters})
    steps = await docker._query_json(
        "containers/json", params={"all": "1", "size": "1", "filters": filters}
    )
    sizes = [int(i.get("Size") or 0) for i in made or ()]
    sizes += [int(c.get("SizeRootFs") or 0) for c in steps or ()]
    return max(sizes, default=0)
