"""`allow_private_networks` is the operator's grant, not the caller's switch; and
whatever the grant, the proxy never reaches this host (its listeners, its interfaces) nor cloud
metadata. Upstreams and the relay come from test_egress_integration; a bystander tenant keeps
working throughout."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import grpc
import pytest
from authutil import tenant_fixture, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    own_server,
    remove_owned_containers,
    run,
    start_server,
)
from sandboxd.v1 import common_pb2, session_pb2
from test_egress_integration import (
    allowlist,
    assert_no_owned_networks,
    bridge_gateway,
    connect,
    through_proxy,
)
from test_egress_integration import (
    upstreams as upstreams,  # noqa: F401 - the module fixture, shared
)

PD = grpc.StatusCode.PERMISSION_DENIED
ALPHA = "alpha-" + secrets.token_urlsafe(24)
BETA = "beta-" + secrets.token_urlsafe(24)


def _create(s: Stubs, network: common_pb2.NetworkPolicy) -> str:
    resp = s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True), network=network
        )
    )
    return str(resp.session.session_id)


def _delete(s: Stubs, sid: str) -> None:
    s.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


@pytest.fixture(scope="module")
def granted_server(
    tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, object]
) -> Iterator[ServerProcess]:
    """A server whose tenant alpha holds the private-networks grant (beta does not), with names
    for this host's own addresses and the cloud metadata services."""
    data = tmp_path_factory.mktemp("hostile-egress")
    tokens = write_tokens(
        data / "tokens", {ALPHA: "alpha", BETA: "beta"}, {"alpha": "egress_private_networks=allow"}
    )
    hosts = ",".join(
        [
            f"relay.test={upstreams['relay']}",
            "loop.test=127.0.0.1",
            "loop6.test=::1",
            "mapped.test=::ffff:127.0.0.1",
            f"bridge.test={bridge_gateway()}",
            "meta.test=169.254.169.254",
            "wire.test=168.63.129.16",
            "meta6.test=fd00:ec2::254",
            "zero.test=0.0.0.0",
        ]
    )
    owner = "hegr" + secrets.token_hex(4)
    with own_server(
        data / "data",
        owner,
        "--tokens-file",
        str(tokens),
        "--metrics-listen",
        "127.0.0.1:0",
        env={"SANDBOXD_PROXY_HOSTS": hosts},
    ) as srv:
        yield srv
    assert_no_owned_networks(owner)


alpha = tenant_fixture("granted_server", ALPHA)


beta = tenant_fixture("granted_server", BETA)


def test_callers_cannot_grant_themselves_private_networks(
    alpha: Stubs, beta: Stubs, upstreams: dict[str, object]
) -> None:
    echo = int(str(upstreams["echo"]))
    expect_error(
        lambda: _create(beta, allowlist(["relay.test"], [echo], private=True)),
        PD,
        "PRIVATE_NETWORKS_NOT_GRANTED",
    )
    # not by a policy update either
    sid = _create(beta, allowlist(["relay.test"], [echo], private=False))
    try:
        expect_error(
            lambda: beta.sessions.UpdateNetworkPolicy(
                session_pb2.UpdateNetworkPolicyRequest(
                    session_id=sid, network=allowlist(["relay.test"], [echo], private=True)
                )
            ),
            PD,
            "PRIVATE_NETWORKS_NOT_GRANTED",
        )
        out = through_proxy(beta, sid, connect("relay.test", echo, "x"))
        assert "ADDRESS_REFUSED" in out, out  # the relay's private address stays closed
    finally:
        _delete(beta, sid)
    # the tenant holding the grant reaches the private network
    sid = _create(alpha, allowlist(["relay.test"], [echo], private=True))
    try:
        assert through_proxy(alpha, sid, connect("relay.test", echo, "hi")).endswith("ECHO:hi")
    finally:
        _delete(alpha, sid)


def test_without_a_grant_the_default_is_deny(tmp_path_factory: pytest.TempPathFactory) -> None:
    owner = "hegr" + secrets.token_hex(4)
    srv = start_server(tmp_path_factory.mktemp("deny"), owner)
    try:
        s = make_stubs(srv.address)
        expect_error(
            lambda: _create(s, allowlist(["up.test"], [443], private=True)),
            PD,
            "PRIVATE_NETWORKS_NOT_GRANTED",
        )
        s.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
        assert_no_owned_networks(owner)


def test_the_host_and_metadata_are_refused_whatever_the_grant(
    granted_server: ServerProcess, alpha: Stubs, beta: Stubs, upstreams: dict[str, object]
) -> None:
    grpc_port = granted_server.port
    served = next(line for line in granted_server.log_lines if "metrics served at" in line)
    metrics_port = int(served.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
    echo = int(str(upstreams["echo"]))
    counter = upstreams["counter"]
    bystander = _create(beta, allowlist(["relay.test"], [echo], private=False))
    names = ["loop.test", "loop6.test", "mapped.test", "bridge.test", "meta.test"]
    names += ["wire.test", "meta6.test", "zero.test"]
    ports = [grpc_port, metrics_port, 3128, echo, 80]
    sid = _create(alpha, allowlist(names + ["relay.test"], ports, private=True))
    try:
        before = counter.connections  # type: ignore[attr-defined]
        cases = [
            ("loop.test", grpc_port),  # sandboxd's own gRPC port
            ("loop.test", metrics_port),  # its metrics endpoint
            ("loop6.test", grpc_port),
            ("mapped.test", grpc_port),
            ("bridge.test", echo),  # a listener on this host's bridge address
            ("meta.test", 80),
            ("wire.test", 80),
            ("meta6.test", 80),
            ("zero.test", grpc_port),
        ]
        for name, port in cases:
            out = through_proxy(alpha, sid, connect(name, port))
            assert out.startswith("HTTP/1.1 403") and "ADDRESS_REFUSED" in out, (name, out)
        assert counter.connections == before  # type: ignore[attr-defined]
        # the grant still works for the private network that is not this host
        assert through_proxy(alpha, sid, connect("relay.test", echo, "ok")).endswith("ECHO:ok")
        assert run(beta, bystander, "true").exit_code == 0
    finally:
        _delete(alpha, sid)
        _delete(beta, bystander)
