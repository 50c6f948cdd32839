"""The hardened container profile of a sandbox, as a Docker create request (pure functions).

Every control of SECURITY.md's container defaults is set here, in one place, so a test can
read the profile back with `docker inspect` and compare it control by control. Only the
Docker adapter builds these documents; the domain asks for a `SandboxRequest`.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxd import images, trust
from sandboxd.engine.agent_socket import AGENT_SOCKET, socket_volume_of
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.isolation import Isolation
from sandboxd.labels import LABEL_FINGERPRINT, LABEL_OWNER, LABEL_POOL, LABEL_SESSION
from sandboxd.models import VolumeMount
from sandboxd.profile import HELPER_IN_CONTAINER, TMP_BYTES, base_env
from sandboxd.storage.disk_tool import DISK_MOUNT_PREFIX
from sandboxd.storage.disks import DiskMount

HELPER_DIR = posixpath.dirname(HELPER_IN_CONTAINER)

NO_PROXY = "localhost,127.0.0.1,::1"
# The agent's own identity: root with only these capabilities (Docker's names), no-new-privileges.
# It starts every command as the session's uid:gid (`sbx agent --user UID:GID`): a command then
# holds no capability and shares no uid with the agent, so it can neither signal, stop, trace,
# limit (prlimit) nor read it under any runtime (gVisor does not protect a PID 1 from its own
# namespace; prlimit asks only for matching uids). CAP_KILL: the agent signals their processes.
AGENT_USER = "0:0"
AGENT_CAPS = ("SETUID", "SETGID", "KILL")
AGENT_CMD = (HELPER_IN_CONTAINER, "agent")
# The HostConfig fields a tampering check compares (plus the capabilities, no-new-privileges,
# and the main process's command and user, which say who the commands run as).
# Runtime: a sandbox moved from gvisor to runc would lose its kernel boundary unnoticed.
# OomScoreAdj: the agent's, 0, below every command's 1000 (SECURITY.md, "Memory of the agent").
_CHECKED = (
    "Memory",
    "OomScoreAdj",
    "MemorySwap",
    "NanoCpus",
    "PidsLimit",
    "ReadonlyRootfs",
    "Privileged",
    "Runtime",
)


def container_config(
    request: SandboxRequest,
    *,
    helper_volume: str,
    keeper_user: str,
    runtime: str = "runc",
    agent: bool = True,
    workspace_volume: str = "",
) -> dict[str, Any]:
    """The create request, under the OCI `runtime` of the session's isolation tier (runc, or
    runsc for gvisor).

    With `agent` the main process is the in-sandbox agent (docs/agent.md), the same under
    every runtime: PID 1 of the container (`Init` off), stdin open for the server's channel,
    as root with only AGENT_CAPS, starting every command as the session's uid:gid. Without
    (the setting `agent = false`), it idles as `keeper_user`, a uid different from the sandbox
    user's, behind Docker's init, with no capability, and commands are `docker exec`s.
    """
    spec = request.spec
    limits = spec.limits
    labels = (
        {LABEL_OWNER: request.owner_id, LABEL_POOL: request.pool_generation}
        if request.pool_generation
        else {
            LABEL_OWNER: request.owner_id,
            LABEL_SESSION: request.session_id,
            LABEL_FINGERPRINT: request.fingerprint,
        }
    )
    config: dict[str, Any] = {
        # A resumed session runs the image it was created from, whatever the tag says now.
        "Image": spec.image_id or spec.image,
        "Cmd": agent_command(spec.user) if agent else [HELPER_IN_CONTAINER, "idle"],
        "Entrypoint": [],
        "User": AGENT_USER if agent else keeper_user,
        "WorkingDir": "/",
        "Env": [
            f"{k}={v}" for k, v in {**base_env(spec), **trust.sandbox_env(spec.network)}.items()
        ],
        "Hostname": "sandbox",
        "Labels": labels,
        "NetworkDisabled": True,
        "AttachStdin": agent,
        "AttachStdout": agent,
        "AttachStderr": agent,
        "Tty": False,
        # The channel's pipe: kept open across attachments (a server restart re-attaches).
        "OpenStdin": agent,
        "StdinOnce": False,
        "StopSignal": "SIGKILL",
        # An image's HEALTHCHECK would run commands outside every supervisor.
        "Healthcheck": images.HEALTHCHECK_OFF,
        "HostConfig": {
            "NetworkMode": "none",
            "Runtime": runtime,
            # The agent's (PID 1's): a lower one needs CAP_SYS_RESOURCE in the engine, which
            # not every engine has (this one's dockerd has not: measured).
            "OomScoreAdj": 0,
            "ReadonlyRootfs": True,
            "Tmpfs": {
                "/workspace": (
                    f"rw,nosuid,nodev,size={limits.workspace_bytes},"
                    f"uid={spec.uid},gid={spec.gid},mode=0700"
                ),
                "/tmp": f"rw,noexec,nosuid,nodev,size={TMP_BYTES},mode=1777",
                **trust.tmpfs(spec.network),
            },
            "CapDrop": ["ALL"],
            "CapAdd": list(AGENT_CAPS) if agent else [],
            "SecurityOpt": ["no-new-privileges:true"],
            "Privileged": False,
            "Memory": limits.memory_bytes,
            "MemorySwap": limits.memory_bytes,
            "NanoCpus": limits.cpu_millis * 1_000_000,
            "PidsLimit": limits.pids,
            "Init": not agent,
            "IpcMode": "private",
            # The helper comes from a volume named after its content, never bound from the
            # server's own file: /proc/self/mountinfo would show the server host's path.
            "Binds": [f"{helper_volume}:{HELPER_DIR}:ro"],
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "LogConfig": {"Type": "none", "Config": {}},
            "Ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}],
        },
    }
    if spec.on_disk:
        # The disk workspace (sandboxd.storage): the engine volume that mounts it now, which
        # only the engine's attach knows (it names the loop device); the shape leaves it out.
        host = config["HostConfig"]
        del host["Tmpfs"]["/workspace"]
        host["Mounts"] = [
            DiskMount(
                workspace_volume or disk_volume_prefix(spec.disk_id), "/workspace"
            ).engine_mount()
        ]
    if spec.volumes:
        host = config["HostConfig"]
        host["Mounts"] = [*host.get("Mounts", []), *volume_mounts(spec.volumes, host["Tmpfs"])]
    if spec.isolation is Isolation.GVISOR:
        config["HostConfig"].update(gvisor_pids(limits.pids))
    if request.cpu_shares:  # the tenant's weight (tenant_cpu.py); not part of the shape
        config["HostConfig"]["CpuShares"] = request.cpu_shares
    if request.egress_port:
        config = apply_to_container(config, request.egress_port)
    return config


def shape_of(config: Mapping[str, Any]) -> str:
    """The identity of a create request, its bookkeeping left out: the labels, and the CPU
    weight, which the service sets in place on a claimed warm sandbox (tenant_cpu.py)."""
    shaped = {k: v for k, v in config.items() if k != "Labels"}
    shaped["HostConfig"] = {k: v for k, v in config["HostConfig"].items() if k != "CpuShares"}
    return hashlib.sha256(json.dumps(shaped, sort_keys=True, default=str).encode()).hexdigest()


def volume_mounts(volumes: Sequence[VolumeMount], tmpfs: dict[str, str]) -> list[dict[str, Any]]:
    """The session's volumes (sandboxd.volumes): each disk at its path, read-only where asked,
    never filled from the image (NoCopy). A disk at /workspace (the server's own porter of a
    volume's content, never a session: their paths are below /mnt) takes the tmpfs's place."""
    if any(v.path == "/workspace" for v in volumes):
        tmpfs.pop("/workspace", None)
    return [
        {
            "Type": "volume",
            "Source": v.disk,
            "Target": v.path,
            "ReadOnly": v.read_only,
            "VolumeOptions": {"NoCopy": True},
        }
        for v in volumes
    ]


# Host threads of gVisor's own Sentry and gofer (about 60 idle, more per task under the ptrace
# platform), all in the container's pids cgroup: measured, a cgroup cap of 64 crashes the Sentry.
# They never go back down: the ptrace platform keeps every address space's stub process, with a
# thread for each Sentry thread that ran in it, for reuse (measured with runsc 0.0~20221219: 30
# sleeping tasks made 300, sixty short ones more 1,380; a session of 64 pids whose three callers
# started 72 writers reached 1,628 with the agent's guard holding it to 64 tasks, past the
# earlier 8 per task, 1,536, where the Sentry could make no thread and the sandbox ended). The
# session's processes are the agent's guard's to bound (helper/agent_guard.c); this is the
# backstop, with room for 2.5 times what was measured. Their kernel memory is charged to the
# sandbox's own memory cgroup.
GVISOR_HOST_PIDS = 1024
GVISOR_HOST_PIDS_PER_TASK = 48


def gvisor_pids(pids: int) -> dict[str, Any]:
    """Under gVisor the session's `pids` is enforced by the Sentry for the commands' forks
    (RLIMIT_NPROC of the sandbox user: measured to refuse fork with EAGAIN) and by the agent's
    guard for its starts (which the Sentry does not count: three callers reached 100 processes
    in a session of 64), while the host cgroup cap stays as a backstop sized for the Sentry's
    own threads."""
    return {
        "PidsLimit": GVISOR_HOST_PIDS + pids * GVISOR_HOST_PIDS_PER_TASK,
        "Ulimits": [
            {"Name": "core", "Soft": 0, "Hard": 0},
            {"Name": "nproc", "Soft": pids, "Hard": pids},
        ],
    }


def apply_to_container(config: dict[str, Any], egress_port: int) -> dict[str, Any]:
    """An ALLOWLIST session's container profile: still network mode none (loopback only), with
    the proxy variables pointing at the agent's listener on the sandbox's loopback, which
    carries each connection over the channel to the session's proxy (docs/agent.md)."""
    config = dict(config)
    proxy_url = f"http://127.0.0.1:{egress_port}"
    proxy_env = {
        "HTTP_PROXY": proxy_url,
        "HTTPS_PROXY": proxy_url,
        "http_proxy": proxy_url,
        "https_proxy": proxy_url,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
    }
    env = [e for e in config.get("Env", []) if e.split("=", 1)[0] not in proxy_env]
    config["Env"] = env + [f"{k}={v}" for k, v in proxy_env.items()]
    return config


def agent_command(user: str) -> list[str]:
    """The agent's command line: every command it starts runs as `user` (the session's)."""
    return [*AGENT_CMD, "--user", user]


def with_agent_socket(config: dict[str, Any], bind: str) -> dict[str, Any]:
    """The create request with the agent's socket channel (engine/agent_socket.py): its
    volume bound at AGENT_SOCKET_DIR and `--channel-socket` on the agent's command line.
    Added at create only, so the shape and a conformance's wanted config stay without it."""
    config = {**config, "Cmd": [*config["Cmd"], "--channel-socket", AGENT_SOCKET]}
    host = config["HostConfig"] = dict(config["HostConfig"])
    host["Binds"] = [*host["Binds"], bind]
    return config


def _socket_extras(cmd: Sequence[str], binds: Sequence[str]) -> tuple[list[str], list[str]]:
    """The command line and binds with the agent's socket channel taken out, when it has one
    (both together, the bind's source a socket volume by its name); else as they are."""
    cmd, binds = list(cmd), [str(b) for b in binds]
    tail = ["--channel-socket", AGENT_SOCKET]
    ours = [b for b in binds if socket_volume_of(b) is not None]
    if cmd[-2:] == tail and len(ours) == 1:
        return cmd[:-2], [b for b in binds if b not in ours]
    return cmd, binds


def _targets(binds: Sequence[str]) -> list[str]:
    """Where each bind lands in the container, and how (`/.sandboxd:ro`), in order; the source
    may differ (a helper volume of another build)."""
    return [str(b).split(":", 1)[-1] for b in binds]


def commands_user(config: Mapping[str, Any]) -> str | None:
    """Who the commands of a container's agent run as, from its `Config` (docker inspect);
    None when its main process is not the agent (`agent = false`: the keeper).

    `sbx agent --user U` runs them as U. A bare `sbx agent` (made by an older server) runs
    them as itself, the container's user: the session's, or, for a gVisor sandbox's agent
    that carried egress only, `keeper_user`, which no command runs as.
    """
    cmd = list(config.get("Cmd") or [])
    if cmd[-2:] == ["--channel-socket", AGENT_SOCKET]:
        cmd = cmd[:-2]
    if cmd[:2] != list(AGENT_CMD):
        return None
    if len(cmd) == 2:
        return str(config.get("User") or "")
    if len(cmd) == 4 and cmd[2] == "--user":
        return str(cmd[3])
    return None


def _caps(names: object) -> frozenset[str]:
    """Capability names as a set, spelled as Docker reports either way (`KILL`, `CAP_KILL`)."""
    if not isinstance(names, list):
        return frozenset()
    return frozenset(str(n).upper().removeprefix("CAP_") for n in names)


def conforms(want: Mapping[str, Any], info: Mapping[str, Any]) -> bool:
    """False when a container's limits or security settings are not the requested ones: every
    capability added must be exactly the requested set (the agent's three, or none), the
    main process the requested command as the requested user (with the agent's capabilities,
    another command line could run commands as root), the workspace the session's own."""
    wanted = want["HostConfig"]
    have = info.get("HostConfig") or {}
    if any(have.get(k) != wanted.get(k) for k in _CHECKED if k != "NanoCpus"):
        return False
    # A lower CPU limit is the tenant's demotion (tenant_cpu.py), set in place; never a higher one.
    cpus, wanted_cpus = have.get("NanoCpus") or 0, wanted.get("NanoCpus") or 0
    if cpus != wanted_cpus and not 0 < cpus < wanted_cpus:
        return False
    if _caps(have.get("CapAdd")) != _caps(wanted.get("CapAdd")):
        return False
    if "ALL" not in _caps(have.get("CapDrop")):
        return False
    # The workspace's owner is the session's host uid (its `uid=`/`gid=`): another would be a
    # container made for another identity.
    workspace = (have.get("Tmpfs") or {}).get("/workspace")
    if workspace != wanted["Tmpfs"].get("/workspace"):
        return False
    if not _same_workspace_disk(wanted, have):
        return False
    config = info.get("Config") or {}
    # The socket channel's bind and flag come together or not at all; no other bind is new.
    cmd, binds = _socket_extras(config.get("Cmd") or [], have.get("Binds") or [])
    if cmd != list(want["Cmd"]) or _targets(binds) != _targets(wanted.get("Binds") or []):
        return False
    if str(config.get("User") or "") != want["User"]:
        return False
    return "no-new-privileges:true" in (have.get("SecurityOpt") or [])


def _same_workspace_disk(wanted: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    """A disk workspace's container mounts a volume of its own disk at /workspace (any loop:
    the disk may have been attached again since), and a memory one mounts none there."""

    def workspace_mounts(host: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [m for m in host.get("Mounts") or [] if m.get("Target") == "/workspace"]

    want, got = workspace_mounts(wanted), workspace_mounts(have)
    if not want:
        return not got
    if len(got) != 1 or got[0].get("Type") != "volume" or got[0].get("ReadOnly"):
        return False
    source, wanted_source = str(got[0].get("Source") or ""), str(want[0]["Source"])
    if wanted_source.endswith("-"):  # asked without an attach: any loop of that disk
        return source.startswith(wanted_source)
    return source == wanted_source


def disk_volume_prefix(disk_id: str) -> str:
    """What every mount volume of a disk's name starts with (storage/docker_disks.py)."""
    return f"{DISK_MOUNT_PREFIX}{disk_id}-"
