"""Secret bindings: validation of every field, sealing, placeholders and live updates, the
vault (sealer, secrets file), the store's copy, and the sandbox's environment."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxd import trust
from sandboxd.egress.policy import validate_policy
from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import ConfigError, InvalidArgument
from sandboxd.models import NetworkMode, NetworkPolicy, SecretBinding
from sandboxd.reasons import Reason
from sandboxd.secrets import bindings, vault
from sandboxd.session_rows import spec_from_json, spec_to_json
from sandboxd.sessions.spec import check_network

ALLOW = NetworkMode.ALLOWLIST
VALUE = b"s3cret-value-123"


@pytest.fixture(autouse=True)
def fresh_vault(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "secrets"
    path.write_text("default/api sk-from-file\nother/api not-yours\n")
    vault.configure("", str(path))
    yield path
    vault.configure("", "")


def policy(
    *bs: SecretBinding, domains: tuple[str, ...] = ("api.test", "*.wild.test")
) -> NetworkPolicy:
    return NetworkPolicy(ALLOW, domains, (443,), secrets=bs)


def binding(**kw: object) -> SecretBinding:
    fields: dict[str, object] = {
        "name": "API_KEY",
        "hosts": ("API.test",),
        "header": "Authorization",
        "template": "Bearer {secret}",
        "value": VALUE,
    }
    fields.update(kw)
    return SecretBinding(**fields)  # type: ignore[arg-type]


def created(*bs: SecretBinding) -> NetworkPolicy:
    return check_network(policy(*bs), lambda: None)


def test_value_sealed_and_dropped_placeholder_drawn() -> None:
    (b,) = created(binding()).secrets
    assert b.value is None and b.sealed and VALUE not in b.sealed
    assert b.hosts == ("api.test",)
    assert b.placeholder.startswith("sbx_secret_") and len(b.placeholder) == 51
    assert vault.vault().sealer.open(b.sealed, "API_KEY") == VALUE
    assert VALUE.decode() not in repr(b) and "sealed" not in repr(b)
    (other,) = created(binding()).secrets
    assert other.placeholder != b.placeholder  # unique per session


def test_ref_binding_for_own_tenant_only() -> None:
    (b,) = created(binding(value=None, secret_ref="api", header="", template="")).secrets
    assert b.secret_ref == "api" and not b.sealed
    with pytest.raises(InvalidArgument) as e:
        created(binding(value=None, secret_ref="missing"))
    assert e.value.reason == Reason.SECRET_REF_NOT_FOUND


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"name": "1BAD"}, "environment variable"),
        ({"name": "PATH"}, "environment variable"),
        ({"name": "SSL_CERT_FILE"}, "environment variable"),
        ({"name": "SANDBOXD_X"}, "environment variable"),
        ({"name": "A" * 129}, "environment variable"),
        ({"value": None}, "value or a secret_ref"),
        ({"secret_ref": "api"}, "not both"),
        ({"value": b"a\r\nX-Evil: 1"}, "CR, LF or NUL"),
        ({"value": b"a\0b"}, "CR, LF or NUL"),
        ({"value": b"x" * 8193}, "1 to 8192"),
        ({"hosts": ()}, "1 to 64"),
        ({"hosts": ("evil.test",)}, "not in network.allowed_domains"),
        ({"hosts": ("*.x.test",)}, "not in network.allowed_domains"),
        ({"hosts": ("*.api.test",)}, "not in network.allowed_domains"),
        ({"hosts": ("1.2.3.4",)}, "hosts entry"),
        ({"hosts": ("a.*.test",)}, "hosts entry"),
        ({"header": ""}, "go together"),
        ({"template": ""}, "go together"),
        ({"header": "Host"}, "not a header"),
        ({"header": "Content-Length"}, "not a header"),
        ({"header": "Bad Header"}, "not a header"),
        ({"template": "Bearer"}, "must contain {secret}"),
        ({"template": "Bearer {secret}\r\n"}, "printable ASCII"),
        ({"template": "é {secret}"}, "printable ASCII"),
    ],
)
def test_bad_binding_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        created(binding(**fields))
    assert e.value.reason == Reason.SECRET_BINDING_INVALID
    assert words in str(e.value)
    assert VALUE.decode() not in str(e.value) and "X-Evil" not in str(e.value)


def test_wildcard_hosts_covered_by_allowed_wildcards() -> None:
    (b,) = created(binding(hosts=("*.wild.test", "a.wild.test", "*.b.wild.test"))).secrets
    assert b.hosts == ("*.b.wild.test", "*.wild.test", "a.wild.test")


def test_duplicate_names_and_too_many_refused() -> None:
    with pytest.raises(InvalidArgument, match="declared twice"):
        created(binding(), binding())
    many = [binding(name=f"K{i}") for i in range(bindings.MAX_BINDINGS + 1)]
    with pytest.raises(InvalidArgument, match="more than"):
        created(*many)


def test_secrets_need_allowlist() -> None:
    with pytest.raises(InvalidArgument, match="ALLOWLIST"):
        validate_policy(NetworkPolicy(secrets=(binding(),)))
    with pytest.raises(InvalidArgument, match="ALLOWLIST"):
        validate_policy(NetworkPolicy(refuse_misdirected_secrets=True))


def test_live_update_keeps_placeholders_and_sources_refuses_new_names() -> None:
    live = created(binding(), binding(name="REF", value=None, secret_ref="api"))
    asked = check_network(
        policy(binding(value=b"rotated"), binding(name="REF", value=None)), lambda: None, live=True
    )
    new = bindings.settle_secrets(asked, live)
    old = {b.name: b for b in live.secrets}
    for b in new.secrets:
        assert b.placeholder == old[b.name].placeholder
    api = next(b for b in new.secrets if b.name == "API_KEY")
    assert vault.vault().sealer.open(api.sealed, "API_KEY") == b"rotated"
    assert next(b for b in new.secrets if b.name == "REF").secret_ref == "api"
    with pytest.raises(InvalidArgument, match="cannot gain"):
        bindings.settle_secrets(
            check_network(policy(binding(name="NEW")), lambda: None, live=True), live
        )


def test_sealer_keys(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("ab" * 32)
    a = vault.Sealer.from_file(key)
    b = vault.Sealer.from_file(key)
    assert b.open(a.seal(VALUE, "N"), "N") == VALUE  # the same key after a restart
    with pytest.raises(vault.SecretUnavailable):
        vault.Sealer().open(a.seal(VALUE, "N"), "N")  # an in-memory key of another run
    with pytest.raises(vault.SecretUnavailable):
        a.open(a.seal(VALUE, "N"), "OTHER")  # bound to the name
    key.write_bytes(b"short")
    with pytest.raises(ConfigError):
        vault.Sealer.from_file(key)
    with pytest.raises(ConfigError):
        vault.Sealer.from_file(tmp_path / "absent")


def test_secrets_file_syntax_and_reload(fresh_vault: Path) -> None:
    got = vault.parse(b"# c\n\n t/a  v 1 \nnoslash v\n/x v\nt/ v\nt/b\nt/c x\nt/n a\0b\r\n")
    assert got == {("t", "a"): b"v 1", ("t", "c"): b"x"}
    f = vault.vault().file
    assert f.get("default", "api") == b"sk-from-file"
    fresh_vault.write_text("default/api rotated-in-file!\n")
    f._checked -= vault.RECHECK_S  # as if a second went by
    assert f.get("default", "api") == b"rotated-in-file!"
    with pytest.raises(vault.SecretUnavailable) as e:
        f.get("default", "nope")
    assert "rotated" not in str(e.value)


def test_store_keeps_sealed_bytes_never_the_value() -> None:
    network = created(binding(), binding(name="REF", value=None, secret_ref="api"))
    spec = spec_from_json(spec_to_json(_spec(network)))
    assert spec.network == network  # sealed and placeholders back
    assert VALUE not in spec_to_json(_spec(network)).encode()
    fingerprint = _spec(network).fingerprint()
    rotated = dataclasses.replace(
        network,
        secrets=tuple(dataclasses.replace(b, sealed=b"other") for b in network.secrets),
    )
    assert _spec(rotated).fingerprint() == fingerprint  # a rotation is not a new sandbox


def _spec(network: NetworkPolicy):  # type: ignore[no-untyped-def]
    from sandboxd.models import Limits, SessionSpec, ShellPolicy, WorkspaceManifest

    limits = Limits(
        memory_bytes=1 << 28,
        cpu_millis=500,
        pids=64,
        workspace_bytes=1 << 20,
        file_bytes=1 << 20,
        output_bytes=1 << 20,
        command_timeout_s=10.0,
    )
    return SessionSpec(
        image="img",
        limits=limits,
        shell=ShellPolicy(),
        network=network,
        env={"API_KEY": "user-set"},
        uid=1000,
        gid=1000,
        manifest=WorkspaceManifest(id="", files=(), directories=()),
    )


def test_container_gets_placeholders_ca_variables_and_trust_tmpfs(tmp_path: Path) -> None:
    network = created(binding())
    spec = _spec(network)
    config = container_config(
        SandboxRequest(spec=spec, owner_id="o", name="n", session_id="s", fingerprint="f"),
        helper_volume="sandboxd-helper-test",
        keeper_user="1:1",
    )
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["API_KEY"] == network.secrets[0].placeholder  # wins over the caller's env
    assert (
        env["SSL_CERT_FILE"] == trust.BUNDLE == env["REQUESTS_CA_BUNDLE"] == env["CURL_CA_BUNDLE"]
    )
    assert env["NODE_EXTRA_CA_CERTS"] == trust.SESSION_CA
    assert VALUE.decode() not in str(config)
    assert "noexec" in config["HostConfig"]["Tmpfs"][trust.TRUST_DIR]
    plain = container_config(
        SandboxRequest(
            spec=_spec(NetworkPolicy()), owner_id="o", name="n", session_id="s", fingerprint="f"
        ),
        helper_volume="sandboxd-helper-test",
        keeper_user="1:1",
    )
    assert trust.TRUST_DIR not in plain["HostConfig"]["Tmpfs"]
    assert not any(e.startswith("SSL_CERT_FILE=") for e in plain["Env"])


def test_bad_upstream_ca_file_is_a_config_error(tmp_path: Path) -> None:
    from sandboxd.secrets.setup import SecretsSetup

    with pytest.raises(ConfigError, match="egress_upstream_ca_file"):
        SecretsSetup(upstream_ca_file=str(tmp_path / "absent.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="egress_upstream_ca_file"):
        SecretsSetup(upstream_ca_file=str(tmp_path / "junk.pem"))
    assert SecretsSetup().interceptor("s", "t", NetworkPolicy()) is None
