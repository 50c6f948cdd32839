"""Validation of a network policy's secret bindings: names, sources, hosts, where values go.

A value is sealed here and the plaintext dropped, so nothing past validation holds it. A
binding sent without a source on a live update keeps the source it had (values are
write-only: a client that reads a policy back and sends it again must not erase them).
"""

from __future__ import annotations

import dataclasses
import re

from sandboxd import tenancy
from sandboxd.errors import InvalidArgument
from sandboxd.models import NetworkPolicy, SecretBinding
from sandboxd.reasons import Reason
from sandboxd.secrets.vault import placeholder, vault
from sandboxd.targets import TargetError, name_allowed, normalize_pattern

MAX_BINDINGS = 32
MAX_HOSTS = 64
MAX_VALUE_BYTES = 8192
MAX_TEMPLATE = 1024
SLOT = "{secret}"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# Variables the server sets itself in every sandbox; a binding cannot shadow them.
RESERVED_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY"}
    | {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"}
)
# Headers the proxy frames or routes by; a secret never goes there.
FORBIDDEN_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
    | {"keep-alive", "proxy-authorization", "proxy-connection", "expect"}
)


def _invalid(name: str, message: str) -> InvalidArgument:
    return InvalidArgument(
        f"network.secrets[{name[:64]!r}]: {message}",
        reason=Reason.SECRET_BINDING_INVALID,
        metadata={"secret": name[:64]},
    )


def _covered(pattern: str, domains: tuple[str, ...]) -> bool:
    """Every name the pattern matches is allowed by the allowlist."""
    if pattern.startswith("*."):
        wildcards = tuple(d for d in domains if d.startswith("*."))
        return pattern in domains or name_allowed("x." + pattern[2:], wildcards)
    return name_allowed(pattern, domains)


def _check_value(name: str, value: bytes) -> None:
    if not value or len(value) > MAX_VALUE_BYTES:
        raise _invalid(name, f"value must be 1 to {MAX_VALUE_BYTES} bytes")
    # A header value: CR, LF or NUL would let a value split the request.
    if any(c in value for c in b"\r\n\0"):
        raise _invalid(name, "value must not contain CR, LF or NUL")


def validate(
    asked: tuple[SecretBinding, ...], domains: tuple[str, ...]
) -> tuple[SecretBinding, ...]:
    """Normalized bindings, values sealed; InvalidArgument SECRET_BINDING_INVALID otherwise."""
    if len(asked) > MAX_BINDINGS:
        raise InvalidArgument(
            f"network.secrets has more than {MAX_BINDINGS} bindings",
            reason=Reason.SECRET_BINDING_INVALID,
        )
    tenant = tenancy.current()
    seen: set[str] = set()
    out = []
    for b in asked:
        name = b.name
        if not _NAME.match(name) or name in RESERVED_NAMES or name.startswith("SANDBOXD_"):
            raise _invalid(
                name, "name must be an environment variable name the server does not set"
            )
        if name in seen:
            raise _invalid(name, "name is declared twice")
        seen.add(name)
        if b.value and b.secret_ref:
            raise _invalid(name, "give value or secret_ref, not both")
        sealed = b""
        if b.value:
            _check_value(name, b.value)
            sealed = vault().sealer.seal(b.value, name)
        if b.secret_ref and not vault().file.has(tenant, b.secret_ref):
            raise InvalidArgument(
                f"network.secrets[{name!r}]: secret_ref {b.secret_ref[:64]!r} is not in the "
                "operator's secrets file for this tenant",
                reason=Reason.SECRET_REF_NOT_FOUND,
                metadata={"secret": name, "secret_ref": b.secret_ref[:64]},
            )
        if not b.hosts or len(b.hosts) > MAX_HOSTS:
            raise _invalid(name, f"hosts must list 1 to {MAX_HOSTS} patterns")
        hosts = set()
        for pattern in b.hosts:
            try:
                host = normalize_pattern(pattern)
            except TargetError as exc:
                raise _invalid(name, f"hosts entry {pattern[:300]!r}: {exc}") from None
            if not _covered(host, domains):
                raise _invalid(name, f"host {host!r} is not in network.allowed_domains")
            hosts.add(host)
        _check_destination(name, b.header, b.template)
        out.append(
            SecretBinding(
                name=name,
                hosts=tuple(sorted(hosts)),
                header=b.header,
                template=b.template,
                secret_ref=b.secret_ref,
                placeholder=b.placeholder,
                sealed=sealed,
            )
        )
    return tuple(sorted(out, key=lambda x: x.name))


def _check_destination(name: str, header: str, template: str) -> None:
    if not header and not template:
        return  # replace the placeholder wherever it is in the request headers
    if not header or not template:
        raise _invalid(name, "header and template go together (or both empty)")
    if not _TOKEN.match(header) or header.lower() in FORBIDDEN_HEADERS:
        raise _invalid(name, f"header {header[:64]!r} is not a header a secret can go in")
    if len(template) > MAX_TEMPLATE or SLOT not in template:
        raise _invalid(name, f"template must contain {SLOT} (at most {MAX_TEMPLATE} characters)")
    if any(not (c == "\t" or " " <= c <= "~") for c in template):
        raise _invalid(name, "template must be printable ASCII")


def settle(
    bindings: tuple[SecretBinding, ...], live: tuple[SecretBinding, ...] | None
) -> tuple[SecretBinding, ...]:
    """Placeholders and sources: fresh at create (`live` None); carried over on an update.

    On a live session a name keeps its placeholder (the sandbox's environment holds it), a
    binding without a source keeps the one it had, and a new name is refused: the
    environment of a running sandbox cannot gain a variable.
    """
    old = {b.name: b for b in live or ()}
    out = []
    for b in bindings:
        before = old.get(b.name)
        if live is not None and before is None:
            raise _invalid(b.name, "a live session cannot gain a secret (its environment is fixed)")
        if not b.sealed and not b.secret_ref:
            if before is None:
                raise _invalid(b.name, "give a value or a secret_ref")
            b = dataclasses.replace(b, sealed=before.sealed, secret_ref=before.secret_ref)
        token = before.placeholder if before is not None else placeholder()
        out.append(dataclasses.replace(b, placeholder=token))
    return tuple(out)


def settle_secrets(network: NetworkPolicy, live: NetworkPolicy) -> NetworkPolicy:
    """`network`, about to replace a running session's `live` policy, with settled secrets."""
    return dataclasses.replace(network, secrets=settle(network.secrets, live.secrets))
