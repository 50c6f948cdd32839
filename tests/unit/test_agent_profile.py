"""The agent's container profile, the same under runc and gVisor (docs/agent.md, "What protects
the agent"): root with exactly CAP_SETUID, CAP_SETGID and CAP_KILL, no-new-privileges, starting
every command as the session's uid:gid; the tampering check accepts exactly that, and the
keeper's profile (`agent = false`) exactly no capability."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from sandboxd.config import Config
from sandboxd.engine.agent_socket import AGENT_SOCKET, AGENT_SOCKET_DIR, VOLUME_PREFIX
from sandboxd.engine.docker_profile import (
    commands_user,
    conforms,
    container_config,
    with_agent_socket,
)
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.isolation import Isolation
from sandboxd.pool import default_spec

COMMON: dict[str, Any] = {"helper_volume": "v", "keeper_user": "65533:65533"}
RUNTIMES = {Isolation.RUNC: "runc", Isolation.GVISOR: "runsc"}


def config_for(tmp_path: Path, tier: Isolation, *, agent: bool = True) -> dict[str, Any]:
    spec = dataclasses.replace(
        default_spec(Config(data_dir=tmp_path)), isolation=tier, uid=1234, gid=4321
    )
    request = SandboxRequest(spec=spec, owner_id="o", name="n")
    return container_config(request, runtime=RUNTIMES[tier], agent=agent, **COMMON)


def inspected(config: dict[str, Any]) -> dict[str, Any]:
    """What `docker inspect` answers for a container created from `config`: Docker reports the
    capabilities it added with their CAP_ prefix."""
    info = copy.deepcopy(config)
    host = info["HostConfig"]
    host["CapAdd"] = ["CAP_" + c for c in host["CapAdd"]] or None
    return {"Config": {k: v for k, v in info.items() if k != "HostConfig"}, "HostConfig": host}


@pytest.mark.parametrize("tier", list(Isolation))
def test_the_agent_runs_as_root_with_three_capabilities_and_commands_as_the_session(
    tmp_path: Path, tier: Isolation
) -> None:
    config = config_for(tmp_path, tier)
    assert config["Cmd"] == ["/.sandboxd/sbx", "agent", "--user", "1234:4321"]
    assert config["User"] == "0:0"
    host = config["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["Init"] is False and config["OpenStdin"] is True
    # The workspace belongs to the session's uid, not to the agent's.
    assert "uid=1234,gid=4321,mode=0700" in host["Tmpfs"]["/workspace"]
    assert commands_user(inspected(config)["Config"]) == "1234:4321"
    assert conforms(config, inspected(config))


def test_the_keeper_profile_has_no_capability_and_no_agent(tmp_path: Path) -> None:
    config = config_for(tmp_path, Isolation.GVISOR, agent=False)
    assert config["Cmd"] == ["/.sandboxd/sbx", "idle"] and config["User"] == "65533:65533"
    assert config["HostConfig"]["CapAdd"] == [] and config["HostConfig"]["Init"] is True
    assert commands_user(config) is None
    assert conforms(config, inspected(config))


@pytest.mark.parametrize("tier", list(Isolation))
def test_an_extra_capability_does_not_conform(tmp_path: Path, tier: Isolation) -> None:
    config = config_for(tmp_path, tier)
    for extra in ("CAP_SYS_ADMIN", "DAC_OVERRIDE", "cap_net_raw"):
        info = inspected(config)
        info["HostConfig"]["CapAdd"] = [*info["HostConfig"]["CapAdd"], extra]
        assert not conforms(config, info), extra


@pytest.mark.parametrize("tier", list(Isolation))
def test_a_missing_capability_or_an_unsplit_drop_does_not_conform(
    tmp_path: Path, tier: Isolation
) -> None:
    config = config_for(tmp_path, tier)
    info = inspected(config)
    info["HostConfig"]["CapAdd"] = ["CAP_SETUID", "CAP_SETGID"]
    assert not conforms(config, info)
    info = inspected(config)
    info["HostConfig"]["CapDrop"] = None  # Docker's default set kept
    assert not conforms(config, info)


@pytest.mark.parametrize("tier", list(Isolation))
def test_missing_no_new_privileges_does_not_conform(tmp_path: Path, tier: Isolation) -> None:
    config = config_for(tmp_path, tier)
    for opts in (None, [], ["no-new-privileges:false"], ["seccomp=unconfined"]):
        info = inspected(config)
        info["HostConfig"]["SecurityOpt"] = opts
        assert not conforms(config, info), opts


@pytest.mark.parametrize("tier", list(Isolation))
def test_a_keeper_container_with_capabilities_does_not_conform(
    tmp_path: Path, tier: Isolation
) -> None:
    """Where none are expected (`agent = false`: the keeper and `docker exec`), any capability
    added is tampering, the agent's three included."""
    config = config_for(tmp_path, tier, agent=False)
    for caps in (["CAP_KILL"], ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"]):
        info = inspected(config)
        info["HostConfig"]["CapAdd"] = caps
        assert not conforms(config, info), caps


@pytest.mark.parametrize("tier", list(Isolation))
def test_the_agents_capabilities_with_another_command_line_do_not_conform(
    tmp_path: Path, tier: Isolation
) -> None:
    """With CAP_SETUID a main process that does not switch (no `--user`, another uid, another
    user) would run commands as root or as someone else: the command line and user are checked."""
    config = config_for(tmp_path, tier)
    changes: list[dict[str, Any]] = [
        {"Cmd": ["/.sandboxd/sbx", "agent"]},
        {"Cmd": ["/.sandboxd/sbx", "agent", "--user", "1:1"]},
        {"Cmd": ["/bin/sh"]},
        {"User": "1234:4321"},
        {"User": ""},
    ]
    for change in changes:
        info = inspected(config)
        info["Config"].update(change)
        assert not conforms(config, info), change
    # An older server's agent profile (the agent as the session's uid) is rebuilt on resume.
    older = inspected(config)
    older["Config"].update(Cmd=["/.sandboxd/sbx", "agent"], User="1234:4321")
    older["HostConfig"]["CapAdd"] = None
    assert not conforms(config, older)


def test_who_the_commands_of_an_agent_run_as() -> None:
    sbx = "/.sandboxd/sbx"
    assert commands_user({"Cmd": [sbx, "agent", "--user", "7:8"], "User": "0:0"}) == "7:8"
    # An older server's agent: the commands ran as the agent itself.
    assert commands_user({"Cmd": [sbx, "agent"], "User": "7:8"}) == "7:8"
    assert commands_user({"Cmd": [sbx, "agent"], "User": "65533:65533"}) == "65533:65533"
    for cmd in ([sbx, "idle"], [sbx, "agent", "--user"], [sbx, "agent", "-u", "7:8"], None, []):
        assert commands_user({"Cmd": cmd, "User": "0:0"}) is None, cmd


@pytest.mark.parametrize("tier", list(Isolation))
def test_another_oom_score_for_the_agent_does_not_conform(tmp_path: Path, tier: Isolation) -> None:
    """The agent's oom_score_adj is Docker's 0, below every command's 1000: a container whose
    PID 1 scores otherwise (1000: the agent the OOM killer's first choice) is not one of ours."""
    config = config_for(tmp_path, tier)
    assert config["HostConfig"]["OomScoreAdj"] == 0
    for other in (1000, 500, -1000):
        info = inspected(config)
        info["HostConfig"]["OomScoreAdj"] = other
        assert not conforms(config, info), other


@pytest.mark.parametrize("agent", [True, False])
def test_a_workspace_owned_by_another_uid_does_not_conform(tmp_path: Path, agent: bool) -> None:
    """The workspace tmpfs is the session's host identity's: a container whose workspace was
    made for another uid (a warm container of another identity, a hand-made one) is not it,
    also without the agent, where no command line names the user."""
    config = config_for(tmp_path, Isolation.RUNC, agent=agent)
    info = inspected(config)
    tmpfs = info["HostConfig"]["Tmpfs"]
    tmpfs["/workspace"] = tmpfs["/workspace"].replace("uid=1234,gid=4321", "uid=77,gid=77")
    assert not conforms(config, info)
    del tmpfs["/workspace"]
    assert not conforms(config, info)


def test_a_lower_cpu_limit_conforms_a_higher_or_none_does_not(tmp_path: Path) -> None:
    """A demoted tenant's sandboxes run under a lower CPU limit set in place (tenant_cpu.py):
    still the sandbox that was made. A higher limit, or none, would be someone's widening."""
    config = config_for(tmp_path, Isolation.RUNC)
    wanted = config["HostConfig"]["NanoCpus"]
    assert wanted > 10**7
    for cpus, ok in ((wanted, True), (10**7, True), (wanted + 1, False), (0, False), (None, False)):
        info = inspected(config)
        info["HostConfig"]["NanoCpus"] = cpus
        assert conforms(config, info) is ok, cpus


SOCKET_BIND = f"{VOLUME_PREFIX}{'0123abcd' * 3}:{AGENT_SOCKET_DIR}:rw"


def _with_socket(config: dict[str, Any], bind: str = SOCKET_BIND) -> dict[str, Any]:
    return inspected(with_agent_socket(config, bind))


def test_the_socket_channels_bind_and_flag_together_conform(tmp_path: Path) -> None:
    """A runc sandbox made with the socket channel (engine/agent_socket.py) is still the one
    requested: its command line and bind are added at create only."""
    config = config_for(tmp_path, Isolation.RUNC)
    info = _with_socket(config)
    assert info["Config"]["Cmd"][-2:] == ["--channel-socket", AGENT_SOCKET]
    assert conforms(config, info)
    assert commands_user(info["Config"]) == "1234:4321"


@pytest.mark.parametrize("tier", list(Isolation))
def test_any_other_bind_does_not_conform(tmp_path: Path, tier: Isolation) -> None:
    """No bind beside the wanted ones but the socket channel's, and that one only with its
    flag: the flag alone, the bind alone, another source or target, a second bind, each is
    someone's container, not ours."""
    config = config_for(tmp_path, tier)
    socketed = _with_socket(config)
    binds = socketed["HostConfig"]["Binds"]
    variants: list[tuple[str, dict[str, Any]]] = []
    for extra in ("/:/host:rw", "/var/run/docker.sock:/var/run/docker.sock:rw", SOCKET_BIND):
        info = inspected(config)
        info["HostConfig"]["Binds"] = [*info["HostConfig"]["Binds"], extra]
        variants.append((f"extra {extra}", info))  # without the flag
        info = copy.deepcopy(socketed)
        info["HostConfig"]["Binds"] = [*binds, extra]
        variants.append((f"{extra} beside the socket", info))
    info = copy.deepcopy(socketed)
    info["HostConfig"]["Binds"] = binds[:-1]
    variants.append(("the flag without its bind", info))
    for source in (
        "/etc",
        "/var/lib/sandboxd/agent-sockets/0123abcd",  # a host path: a bind shows it
        f"/var/lib/docker/volumes/{SOCKET_BIND.split(':')[0]}/_data",
        f"{VOLUME_PREFIX}0123abcd",  # not our name's shape
        "other",  # another volume
    ):
        info = copy.deepcopy(socketed)
        info["HostConfig"]["Binds"] = [*binds[:-1], f"{source}:{AGENT_SOCKET_DIR}:rw"]
        variants.append((f"the socket from {source}", info))
    info = copy.deepcopy(socketed)
    info["HostConfig"]["Binds"] = [*binds[:-1], SOCKET_BIND.replace(AGENT_SOCKET_DIR, "/etc")]
    variants.append(("the socket's directory elsewhere", info))
    info = inspected(config)
    info["HostConfig"]["Binds"] = ["v:/bin:ro"]  # the helper volume elsewhere
    variants.append(("the helper volume elsewhere", info))
    for what, info in variants:
        assert not conforms(config, info), what
