"""The agent's memory budget in a sandbox (docs/agent.md, "Memory"; SECURITY.md, "Memory of the
agent"): one pure function, used by the engine adapter for HELLO (from the container's own
limits) and by the process manager for each detached exec (from the session's)."""

from __future__ import annotations

from sandboxd.digits import decimal

# The least budget an agent is given (its rings' floors come on top: docs/agent.md, "Memory").
AGENT_MIN_BUDGET = 4 * 1024 * 1024

# What the Sentry of a gVisor sandbox holds in the container's memory cgroup besides what the
# sandbox itself sees as used (its /proc/meminfo), measured with runsc 0.0~20221219 under the
# ptrace platform: about 11 MiB idle and 0.43 MiB more per task (the host's charge minus the
# sandbox's own use, from 0 to 100 sleeping tasks; 28 MiB at 32 tasks of eight writers, which
# these figures give to the MiB); the charge stays at the most tasks the sandbox ran at once.
SENTRY_BASE_BYTES = 12 * 1024 * 1024
SENTRY_TASK_BYTES = 512 * 1024

# How far above the session's memory the host's hard cap of a gVisor sandbox stands (written
# into its host cgroup once started: engine/host_cgroup.py), so that a command still growing
# while the agent's guard looks, kills and the Sentry gives its memory back is absorbed there
# rather than ending the sandbox: a quarter of the memory, at least GVISOR_HEADROOM_MIN (a
# command grows by up to 1 MiB per ms; on a loaded host the guard's looks came 35 to 110 ms
# late, and a kill lands only once the victim's syscall ends: one read(2) may commit its whole
# buffer) and at most GVISOR_HEADROOM_MAX (the host's own memory is what it spends).
GVISOR_HEADROOM_MIN = 64 * 1024 * 1024
GVISOR_HEADROOM_MAX = 256 * 1024 * 1024


def gvisor_host_memory(memory: int) -> int:
    """The host's hard memory limit of a gVisor sandbox of `memory` bytes (0: none)."""
    if memory <= 0:
        return 0
    return memory + min(GVISOR_HEADROOM_MAX, max(GVISOR_HEADROOM_MIN, memory // 4))


def sentry_bytes(pids: int) -> int:
    """What the Sentry of a gVisor sandbox of `pids` tasks at most may hold of its memory."""
    return SENTRY_BASE_BYTES + SENTRY_TASK_BYTES * max(0, pids)


def agent_ring_budget(
    memory: int, workspace: int = 0, *, gvisor: bool = False, pids: int = 0
) -> int:
    """What the agent's rings (running and exited) and its streams' input buffers may hold
    together, of a sandbox of `memory` bytes whose workspace tmpfs may hold `workspace` (its
    pages are the sandbox's memory too): half the memory under runc, a quarter under gVisor,
    whose Sentry takes its own share of the same cgroup (measured: 20 to 43 MiB of resident
    memory besides the sandbox's own) and whose sandbox ends whole when the cgroup is full (no
    process of it is the OOM killer's victim alone); and never more than what leaves a quarter
    of the memory to the commands with the workspace full (a sandbox of 128 MiB with its 64 MiB
    workspace full and half of it in rings had nothing left but the agent for the OOM killer).
    Under gVisor the Sentry's own share for `pids` tasks (sentry_bytes) is left out of the
    room too: the host charges it to the same limit, outside the sandbox's view (a sandbox of
    128 MiB with eight writers' rings at a quarter and its 64 MiB workspace filled came to 150
    MiB). Past it a ring still filling wraps where it is (its readers see a gap) rather than
    the agent pressing the sandbox's memory. 0 (no limit known): the agent's own default."""
    if memory <= 0:
        return 0
    share = memory // 4 if gvisor else memory // 2
    room = memory - workspace - memory // 4 - (sentry_bytes(pids) if gvisor else 0)
    return max(AGENT_MIN_BUDGET, min(share, room))


def budget_of_container(host_config: dict[str, object], runtime_gvisor: str = "runsc") -> int:
    """The budget for a container from its HostConfig (Memory, the /workspace tmpfs's size,
    Runtime): what the server sends in HELLO, before any detached exec says it again."""
    memory = host_config.get("Memory")
    if not isinstance(memory, int) or memory <= 0:
        return 0
    workspace = 0
    tmpfs = host_config.get("Tmpfs")
    options = tmpfs.get("/workspace", "") if isinstance(tmpfs, dict) else ""
    for option in str(options).split(","):
        if option.startswith("size=") and (size := decimal(option[5:])) is not None:
            workspace = size
    gvisor = host_config.get("Runtime") == runtime_gvisor
    return agent_ring_budget(memory, workspace, gvisor=gvisor, pids=_nproc(host_config))


def _nproc(host_config: dict[str, object]) -> int:
    """The sandbox user's RLIMIT_NPROC (docker_profile.gvisor_pids sets the session's pids
    there under gVisor, whose host pids cap is the Sentry's threads'); 0 when unset."""
    ulimits = host_config.get("Ulimits")
    for limit in ulimits if isinstance(ulimits, list) else []:
        if isinstance(limit, dict) and limit.get("Name") == "nproc":
            soft = limit.get("Soft")
            return soft if isinstance(soft, int) and soft > 0 else 0
    return 0


def guard_of_container(
    host_config: dict[str, object], runtime_gvisor: str = "runsc"
) -> dict[str, int]:
    """HELLO's `guard` for a gVisor container (empty under any other runtime, whose kernel has
    the OOM killer and pids cgroup that end a command alone): its memory limit, the Sentry's
    share of it (SENTRY_BASE_BYTES, SENTRY_TASK_BYTES) and the session's pids (the sandbox
    user's RLIMIT_NPROC, which docker_profile.gvisor_pids sets to them; the host's pids cap is
    the Sentry's threads'). The agent then kills the largest command before the host's OOM
    killer would take the Sentry, and refuses starts past the pids (SECURITY.md, "Memory of
    the agent")."""
    if host_config.get("Runtime") != runtime_gvisor:
        return {}
    memory = host_config.get("Memory")
    pids = _nproc(host_config)
    guard = {
        "memory": memory if isinstance(memory, int) and memory > 0 else 0,
        "sentry": SENTRY_BASE_BYTES,
        "task": SENTRY_TASK_BYTES,
        "pids": pids,
    }
    return guard if guard["memory"] or guard["pids"] else {}
