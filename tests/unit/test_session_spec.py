"""sessions.spec: a create request checked into a spec, without an engine or a store."""

from __future__ import annotations

import pytest
from sandboxd.config import Config
from sandboxd.errors import InvalidArgument, ResourceExhausted, SandboxError
from sandboxd.models import (
    LimitsRequest,
    ManifestFile,
    NetworkMode,
    NetworkPolicy,
    ShellPolicy,
    WorkspaceManifest,
)
from sandboxd.sessions.spec import CreateSessionInput, check_create

CONFIG = Config()


def _check(**fields: object) -> None:
    check_create(CreateSessionInput(**fields), CONFIG, None)  # type: ignore[arg-type]


def test_defaults_fill_an_empty_request() -> None:
    checked = check_create(CreateSessionInput(), CONFIG, None)
    assert checked.spec.limits == CONFIG.default_limits
    assert checked.spec.image == CONFIG.image
    assert checked.lease_s == CONFIG.lease_default_s
    assert checked.session_id.startswith("s-")
    assert checked.spec.shell == ShellPolicy()


@pytest.mark.parametrize(
    ("fields", "error", "reason"),
    [
        ({"session_id": "Bad Id"}, InvalidArgument, "INVALID_SESSION_ID"),
        ({"limits": LimitsRequest(memory_bytes=0)}, InvalidArgument, "LIMIT_INVALID"),
        ({"limits": LimitsRequest(memory_bytes=1 << 40)}, InvalidArgument, "LIMIT_EXCEEDS_MAXIMUM"),
        ({"limits": LimitsRequest(memory_bytes=1 << 20)}, InvalidArgument, "LIMIT_INVALID"),
        ({"limits": LimitsRequest(cpu_millis=5)}, InvalidArgument, "LIMIT_INVALID"),
        ({"lease_ttl_s": -1.0}, InvalidArgument, "LEASE_INVALID"),
        ({"lease_ttl_s": 1e9}, InvalidArgument, "LIMIT_EXCEEDS_MAXIMUM"),
        ({"shell": ShellPolicy(allow=("/bin/sh",))}, InvalidArgument, "INVALID_SHELL"),
        (
            {"shell": ShellPolicy(allow=tuple(f"c{i}" for i in range(300)))},
            InvalidArgument,
            "INVALID_SHELL",
        ),
        (
            {
                "network": NetworkPolicy(
                    mode=NetworkMode.ALLOWLIST, allowed_domains=("a.example",), allowed_ports=(443,)
                )
            },
            InvalidArgument,
            "NETWORK_MODE_UNSUPPORTED",
        ),
        (
            {
                "manifest": WorkspaceManifest(
                    files=(ManifestFile("a", b"", 0o644), ManifestFile("a", b"", 0o644))
                )
            },
            InvalidArgument,
            "INVALID_MANIFEST",
        ),
        (
            {
                "manifest": WorkspaceManifest(
                    files=(ManifestFile("a", b"", 0o644),), directories=("a/b",)
                )
            },
            InvalidArgument,
            "INVALID_MANIFEST",
        ),
        (
            {"manifest": WorkspaceManifest(files=(ManifestFile("a", b"x" * (2 << 20), 0o644),))},
            ResourceExhausted,
            "FILE_TOO_LARGE",
        ),
        ({"manifest": WorkspaceManifest(id="x" * 300)}, InvalidArgument, "INVALID_MANIFEST"),
    ],
)
def test_bad_fields_are_refused(
    fields: dict[str, object], error: type[SandboxError], reason: str
) -> None:
    with pytest.raises(error) as exc:
        _check(**fields)
    assert exc.value.reason == reason


def test_allowlist_asks_the_server_when_it_has_egress() -> None:
    asked: list[bool] = []
    policy = NetworkPolicy(
        mode=NetworkMode.ALLOWLIST, allowed_domains=("a.example",), allowed_ports=(443,)
    )
    check_create(CreateSessionInput(network=policy), CONFIG, lambda: asked.append(True))
    assert asked == [True]
