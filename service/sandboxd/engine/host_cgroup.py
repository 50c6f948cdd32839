"""A gVisor sandbox's CPU weight and limit, and its memory ceiling, written into its cgroup on
the engine's host.

runsc has no `update`: Docker refuses to change a running gVisor sandbox's resources, so a
tenant's gVisor sandboxes could neither follow its weight as its count changed nor be held to
a demoted tenant's CPU cap (tenant_cpu.py), and a start storm from gVisor sandboxes tripled a
bystander's Run p50. The Sentry, its gofer and every thread of them run on the host in the
container's own cgroup (the engine's cgroupfs or systemd layout, v1 or v2), so a server beside
a local engine writes `cpu.shares`/`cpu.cfs_quota_us` (v1) or `cpu.weight`/`cpu.max` (v2)
there. Docker's record keeps the values the sandbox was made with: the tampering check never
sees these, and the reconcile after a restart sets them again from the tenant's count.

The memory ceiling: the host's OOM killer sees only the Sentry, so a gVisor sandbox whose
commands fill its memory cgroup ends whole; the agent's guard kills the command first, from
inside, by looking (helper/agent_guard.c), and the look, the kill and the Sentry's giving the
memory back take time in which the command still grows (about 1 MiB per ms). The server raises
the host cgroup's limit above the session's memory by a headroom (agent/memory.py,
`gvisor_host_memory`) once the sandbox has started: the Sentry read its limit at boot (the
sandbox's MemTotal stays the session's memory, and so does the guard's line), the host's hard
cap comes that much later.

What it trusts: the engine's `State.Pid` of the container, and the host's /proc of that pid.
A pid that ended and was reused by another process would name another cgroup, so the cgroup
found must be the container's own (its path names the full container id) under the cgroup
root, or nothing is written. A gVisor sandbox cannot move its host processes between cgroups
(its tasks see only the Sentry's own cgroupfs) nor write these files.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxd.agent.memory import gvisor_host_memory
from sandboxd.errors import FailedPrecondition

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
_ID = re.compile(r"\A[0-9a-f]{64}\Z")
_V1_MAX_SHARES, _V2_MAX_WEIGHT = 262144, 10000


def cpu_cgroup(
    container_id: str, pid: int, *, root: Path = CGROUP_ROOT, proc: Path = Path("/proc")
) -> tuple[Path, int]:
    """The container's cpu cgroup directory on this host and the cgroup version (1 or 2)."""
    return host_cgroup(container_id, pid, "cpu", root=root, proc=proc)


def host_cgroup(
    container_id: str,
    pid: int,
    controller: str,
    *,
    root: Path = CGROUP_ROOT,
    proc: Path = Path("/proc"),
) -> tuple[Path, int]:
    """The container's cgroup directory of `controller` (v1; the unified one under v2) on this
    host and the cgroup version (1 or 2)."""
    if not _ID.match(container_id) or pid <= 0:
        raise FailedPrecondition(f"no host process for container {container_id[:12]}")
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError as exc:
        raise FailedPrecondition(f"container {container_id[:12]} has no process: {exc}") from exc
    found: tuple[Path, int] | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):  # v1 (also in a hybrid layout, before the v2 line)
            found = (root / controllers / path.lstrip("/"), 1)
            break
        if controllers == "":
            found = (root / path.lstrip("/"), 2)
    if found is None or container_id not in found[0].as_posix():
        raise FailedPrecondition(
            f"no {controller} cgroup of container {container_id[:12]} on this host"
        )
    group = found[0]
    if ".." in group.parts or not group.is_relative_to(root):
        raise FailedPrecondition(
            f"the {controller} cgroup of container {container_id[:12]} is not under {root}"
        )
    return group, found[1]


def write_cpu(
    container_id: str,
    pid: int,
    shares: int,
    cpu_millis: int = 0,
    *,
    root: Path = CGROUP_ROOT,
    proc: Path = Path("/proc"),
) -> None:
    """Set the weight (in cpu.shares units) and, when `cpu_millis`, the CFS quota."""
    group, version = cpu_cgroup(container_id, pid, root=root, proc=proc)
    shares = max(2, min(shares, _V1_MAX_SHARES))
    try:
        if version == 1:
            (group / "cpu.shares").write_text(str(shares))
            if cpu_millis:
                period = int((group / "cpu.cfs_period_us").read_text())
                (group / "cpu.cfs_quota_us").write_text(str(cpu_millis * period // 1000))
            return
        # Docker's own conversion of shares to a v2 weight (1 + (shares - 2) * 9999 / 262142).
        weight = 1 + (shares - 2) * (_V2_MAX_WEIGHT - 1) // (_V1_MAX_SHARES - 2)
        (group / "cpu.weight").write_text(str(weight))
        if cpu_millis:
            period = int((group / "cpu.max").read_text().split()[1])
            (group / "cpu.max").write_text(f"{cpu_millis * period // 1000} {period}")
    except (OSError, ValueError, IndexError) as exc:
        raise FailedPrecondition(
            f"could not set the CPU of container {container_id[:12]}: {exc}"
        ) from exc


def write_memory_ceiling(
    container_id: str,
    pid: int,
    ceiling: int,
    *,
    root: Path = CGROUP_ROOT,
    proc: Path = Path("/proc"),
) -> None:
    """Set the host's hard memory limit of the container to `ceiling` bytes, never lower than
    it is (v1: memory with swap first, which may not be below it; v2: memory.max, its swap
    apart). A raise only: a ceiling already written (a second start, a restore) stays."""
    group, version = host_cgroup(container_id, pid, "memory", root=root, proc=proc)
    names = (
        ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
        if version == 1
        else ("memory.max",)
    )
    try:
        for name in names:
            path = group / name
            if name == names[0] and version == 1 and not path.exists():
                continue  # a kernel without swap accounting
            now = path.read_text().strip()
            if now != "max" and int(now) < ceiling:
                path.write_text(str(ceiling))
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(
            f"could not set the memory ceiling of container {container_id[:12]}: {exc}"
        ) from exc


def raise_memory(
    container_id: str,
    pid: int,
    host_config: Mapping[str, Any],
    *,
    root: Path = CGROUP_ROOT,
    proc: Path = Path("/proc"),
) -> None:
    """A started gVisor sandbox's host memory cap, its memory and the headroom above it. A host
    whose cgroups the server cannot write keeps Docker's cap (the guard alone then stands, as
    before: SECURITY.md, "Memory of the agent"): said in the log, the start goes on."""
    memory = host_config.get("Memory")
    ceiling = gvisor_host_memory(memory if isinstance(memory, int) else 0)
    if not ceiling:
        return
    try:
        write_memory_ceiling(container_id, pid, ceiling, root=root, proc=proc)
    except FailedPrecondition as exc:
        log.warning("the memory headroom of a gVisor sandbox is not set: %s", exc)
