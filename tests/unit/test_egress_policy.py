"""Pure tests of the egress policy: validation, normalization, quotas, the static name map, and
the container settings of an ALLOWLIST session."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from sandboxd.config import Config
from sandboxd.egress.manager import parse_static_hosts
from sandboxd.egress.policy import DEFAULT_QUOTAS, MAX_QUOTAS, validate_policy
from sandboxd.engine.docker_profile import apply_to_container, container_config
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import ConfigError, InvalidArgument
from sandboxd.isolation import Isolation
from sandboxd.models import NetworkMode, NetworkPolicy, ProxyQuotas
from sandboxd.pool import default_spec

ALLOW = NetworkMode.ALLOWLIST


def test_deny_stays_deny() -> None:
    assert validate_policy(NetworkPolicy()) == NetworkPolicy()


def test_allowlist_normalized_and_quotas_filled() -> None:
    got = validate_policy(
        NetworkPolicy(ALLOW, ("B.example.", "*.A.example", "b.example"), (443, 80, 443))
    )
    assert got.allowed_domains == ("*.a.example", "b.example")
    assert got.allowed_ports == (80, 443)
    assert got.quotas == DEFAULT_QUOTAS


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (NetworkPolicy(NetworkMode.DENY, ("a.example",)), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(NetworkMode.DENY, allow_private_networks=True), "NETWORK_POLICY_INVALID"),
        (
            NetworkPolicy(NetworkMode.DENY, quotas=ProxyQuotas(max_requests=1)),
            "NETWORK_POLICY_INVALID",
        ),
        (NetworkPolicy(ALLOW, (), (443,)), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(ALLOW, ("a.example",), ()), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(ALLOW, ("127.0.0.1",), (443,)), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(ALLOW, ("*",), (443,)), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(ALLOW, ("a.example",), (0,)), "NETWORK_POLICY_INVALID"),
        (NetworkPolicy(ALLOW, ("a.example",), (65536,)), "NETWORK_POLICY_INVALID"),
        (
            NetworkPolicy(ALLOW, ("a.example",), (443,), quotas=ProxyQuotas(idle_timeout_s=-1)),
            "NETWORK_POLICY_INVALID",
        ),
        (
            NetworkPolicy(
                ALLOW,
                ("a.example",),
                (443,),
                quotas=ProxyQuotas(max_connections=(MAX_QUOTAS.max_connections or 0) + 1),
            ),
            "LIMIT_EXCEEDS_MAXIMUM",
        ),
        (NetworkPolicy(ALLOW, tuple(f"d{i}.example" for i in range(257)), (443,)), None),
    ],
)
def test_invalid(policy: NetworkPolicy, reason: str | None) -> None:
    with pytest.raises(InvalidArgument) as exc:
        validate_policy(policy)
    assert exc.value.reason == (reason or "NETWORK_POLICY_INVALID")


def test_fingerprint_covers_allowlist_and_quotas_only_when_allowlist() -> None:
    from dataclasses import replace

    from sandboxd.config import DEFAULT_LIMITS
    from sandboxd.models import SessionSpec, ShellPolicy, WorkspaceManifest

    base = SessionSpec(
        "img", DEFAULT_LIMITS, ShellPolicy(), NetworkPolicy(), {}, 1, 1, WorkspaceManifest()
    )
    a = replace(base, network=validate_policy(NetworkPolicy(ALLOW, ("a.example",), (443,))))
    b = replace(
        base,
        network=validate_policy(
            NetworkPolicy(ALLOW, ("a.example",), (443,), quotas=ProxyQuotas(max_requests=7))
        ),
    )
    assert len({base.fingerprint(), a.fingerprint(), b.fingerprint()}) == 3


def test_static_hosts() -> None:
    assert parse_static_hosts("") == {}
    assert parse_static_hosts("Up.Test.=127.0.0.1, up.test=::1 ,b.test=10.0.0.1") == {
        "up.test": ("127.0.0.1", "::1"),
        "b.test": ("10.0.0.1",),
    }
    for bad in ("up.test", "up.test=", "up.test=localhost", "127.0.0.1=127.0.0.1", "=1.2.3.4"):
        with pytest.raises(ConfigError):
            parse_static_hosts(bad)


def test_container_settings() -> None:
    config = {
        "Env": ["PATH=/bin", "HTTP_PROXY=http://evil"],
        "NetworkDisabled": True,
        "HostConfig": {"NetworkMode": "none", "Memory": 1},
    }
    out = apply_to_container(config, 3128)
    # No network of its own: loopback only, the agent's listener there is the proxy.
    assert out["NetworkDisabled"] is True
    assert out["HostConfig"] == {"NetworkMode": "none", "Memory": 1}
    env = dict(e.split("=", 1) for e in out["Env"])
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://127.0.0.1:3128"
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert env["PATH"] == "/bin"
    assert "HTTP_PROXY=http://evil" not in out["Env"]
    assert config["Env"] == ["PATH=/bin", "HTTP_PROXY=http://evil"]  # the input is not changed


def test_an_allowlist_gvisor_sandbox_has_the_one_agent_as_pid_1(tmp_path: Path) -> None:
    """gVisor runs the same agent as runc (`sbx agent --user`, docs/agent.md): for an ALLOWLIST
    session it carries the egress and the commands alike. Only `agent = false` keeps the idle
    keeper, which carries nothing (that server offers no ALLOWLIST)."""
    spec = dataclasses.replace(default_spec(Config(data_dir=tmp_path)), isolation=Isolation.GVISOR)
    common: dict[str, Any] = {"helper_volume": "v", "keeper_user": "65533:65533"}
    allow = SandboxRequest(spec=spec, owner_id="o", name="n", egress_port=3128)
    agent = container_config(allow, runtime="runsc", **common)
    assert agent["Cmd"][1:] == ["agent", "--user", spec.user] and agent["User"] == "0:0"
    assert agent["HostConfig"]["Init"] is False and agent["HostConfig"]["NetworkMode"] == "none"
    assert agent["OpenStdin"] and agent["AttachStdout"] and not agent["Tty"]
    env = dict(e.split("=", 1) for e in agent["Env"])
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    deny = SandboxRequest(spec=spec, owner_id="o", name="n")
    idle = container_config(deny, runtime="runsc", agent=False, **common)
    assert idle["Cmd"][-1] == "idle" and not idle["OpenStdin"]
    assert idle["User"] == "65533:65533" and idle["HostConfig"]["Init"] is True
