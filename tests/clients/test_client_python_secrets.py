"""The Python client's secret bindings without a sandboxd: every field to the wire and back
(values write-only: never in a repr), and the egress event's secret fields."""

from __future__ import annotations

from sandboxd_client import EgressEvent, NetworkPolicy, SecretBinding
from sandboxd_client._gen.sandboxd.v1 import secrets_pb2, session_pb2


def test_network_policy_secrets_round_trip() -> None:
    policy = NetworkPolicy(
        "ALLOWLIST",
        ("api.example.com",),
        (443,),
        secrets=(
            SecretBinding(
                "API_KEY", ("api.example.com",), b"sk-1", "", "Authorization", "Bearer {secret}"
            ),
            SecretBinding("OTHER", ("api.example.com",), secret_ref="other"),
        ),
        refuse_misdirected_secrets=True,
    )
    pb = policy.to_pb()
    assert pb.secrets[0] == secrets_pb2.SecretBinding(
        name="API_KEY",
        hosts=["api.example.com"],
        value=b"sk-1",
        header="Authorization",
        template="Bearer {secret}",
    )
    assert pb.secrets[1].secret_ref == "other" and pb.refuse_misdirected_secrets
    assert NetworkPolicy.from_pb(pb) == policy
    assert "sk-1" not in repr(policy)


def test_egress_event_secret_fields() -> None:
    e = EgressEvent.from_pb(
        session_pb2.EgressEvent(host="h", kind="secret_injected", secret="API_KEY")
    )
    assert (e.kind, e.secret) == ("secret_injected", "API_KEY")
    assert EgressEvent.from_pb(session_pb2.EgressEvent()).kind == "egress"
