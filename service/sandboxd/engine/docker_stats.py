"""Docker's stats and events APIs, read for session stats and OOM-kill events.

Kept apart from docker.py (the adapter's lifecycle and exec paths); `DockerEngine` delegates.
Docker reports both cgroup versions in one shape, with fields only one of them fills:
`max_usage` (the peak) exists on cgroup v1 only; cgroup v2 reports no peak (0 here).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiodocker

from sandboxd.engine import compat
from sandboxd.engine.protocol import SandboxStats
from sandboxd.labels import LABEL_OWNER


def stats_from(doc: dict[str, Any]) -> SandboxStats:
    cpu = doc.get("cpu_stats") or {}
    usage = cpu.get("cpu_usage") or {}
    throttling = cpu.get("throttling_data") or {}
    memory = doc.get("memory_stats") or {}
    networks = doc.get("networks") or {}
    return SandboxStats(
        cpu_seconds=int(usage.get("total_usage") or 0) / 1e9,
        memory_bytes=int(memory.get("usage") or 0),
        memory_peak_bytes=int(memory.get("max_usage") or 0),
        processes=int((doc.get("pids_stats") or {}).get("current") or 0),
        network_bytes=sum(
            int(n.get("rx_bytes") or 0) + int(n.get("tx_bytes") or 0) for n in networks.values()
        ),
        cpu_throttled_s=int(throttling.get("throttled_time") or 0) / 1e9,
    )


async def read_stats(docker: aiodocker.Docker, sandbox_id: str) -> SandboxStats:
    docs = await docker.containers.container(sandbox_id).stats(stream=False)
    return stats_from(docs[0] if docs else {})


async def oom_kills(docker: aiodocker.Docker, owner_id: str) -> AsyncIterator[str]:
    filters = {"type": ["container"], "event": ["oom"], "label": [f"{LABEL_OWNER}={owner_id}"]}
    async with compat.events_query(docker, {"filters": json.dumps(filters)}) as response:
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            sandbox_id = str(event.get("id") or (event.get("Actor") or {}).get("ID") or "")
            if sandbox_id:
                yield sandbox_id
