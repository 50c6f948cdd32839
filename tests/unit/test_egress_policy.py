"""Pure tests of the egress policy: validation, normalization, quotas, the static name map, and
the container settings of an ALLOWLIST session."""

from __future__ import annotations

import pytest
from sandboxd.egress.networks import (
    SessionNetwork,
    apply_to_container,
    bridge_name,
    parse_static_hosts,
)
from sandboxd.egress.policy import DEFAULT_QUOTAS, MAX_QUOTAS, validate_policy
from sandboxd.errors import ConfigError, InvalidArgument
from sandboxd.models import NetworkMode, NetworkPolicy, ProxyQuotas

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
    net = SessionNetwork("sandboxd-net-o-s", "172.30.0.1", "http://172.30.0.1:3128")
    out = apply_to_container(config, net)
    assert out["NetworkDisabled"] is False
    assert out["HostConfig"] == {
        "NetworkMode": "sandboxd-net-o-s",
        "Memory": 1,
        "Dns": ["172.30.0.1"],
    }
    env = dict(e.split("=", 1) for e in out["Env"])
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://172.30.0.1:3128"
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert env["PATH"] == "/bin"
    assert config["HostConfig"]["NetworkMode"] == "none"  # the input is not changed


def test_bridge_names_fit_linux_interfaces() -> None:
    name = bridge_name("o" * 64, "s" * 128)
    assert len(name) <= 15 and name.startswith("sbx")
    assert name == bridge_name("o" * 64, "s" * 128) != bridge_name("o", "s")


def _private() -> NetworkPolicy:
    return NetworkPolicy(
        NetworkMode.ALLOWLIST,
        allowed_domains=("up.test",),
        allowed_ports=(443,),
        allow_private_networks=True,
    )


def test_private_networks_need_the_operators_grant() -> None:
    """Finding 12.3: a caller cannot switch the address checks off by itself."""
    import contextvars

    from sandboxd import tenancy
    from sandboxd.errors import PermissionDenied

    with pytest.raises(PermissionDenied) as excinfo:
        validate_policy(_private())  # outside any call: nothing granted
    assert excinfo.value.reason == "PRIVATE_NETWORKS_NOT_GRANTED"
    with pytest.raises(PermissionDenied):
        validate_policy(_private(), private_networks_granted=False)
    assert validate_policy(_private(), private_networks_granted=True).allow_private_networks

    def as_tenant(grants: tenancy.TenantGrants, server: str) -> NetworkPolicy:
        tenancy.use_tenant("alpha", tenancy.resolved_grants(grants, server))
        return validate_policy(_private())

    granted = tenancy.TenantGrants(private_networks=True)
    denied = tenancy.TenantGrants(private_networks=False)
    assert contextvars.copy_context().run(as_tenant, tenancy.TenantGrants(), "allow")
    assert contextvars.copy_context().run(as_tenant, granted, "deny")
    for grants, server in ((tenancy.TenantGrants(), "deny"), (denied, "allow")):
        with pytest.raises(PermissionDenied):
            contextvars.copy_context().run(as_tenant, grants, server)
    # not asking needs no grant
    plain = NetworkPolicy(NetworkMode.ALLOWLIST, allowed_domains=("a.test",), allowed_ports=(1,))
    assert not validate_policy(plain).allow_private_networks
