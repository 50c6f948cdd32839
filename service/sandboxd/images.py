"""Which images a session may run: the operator's allowlist, pure and table-tested.

Without it a caller could run any image the engine holds: unrelated local images, and other
tenants' snapshot images (another tenant's session frozen into an image). An image
passes when its reference matches a pattern of the allowlist (the server's `image_allowlist`,
or the tenant's own from the tokens file), or when it is one of the calling tenant's own
snapshot images (by full id, or an id prefix of at least 12 hex digits). Images that declare
VOLUMEs are refused whatever the list: a volume is writable host disk outside every cap.
The server's own repositories (`PRIVATE_REPOSITORIES`: template builds, snapshots) are refused
by name whatever the list says: their images are reached only through the server's own records
(a template's or a snapshot's, with its tenant check), which name them by image id.

Patterns: `*` matches any run of characters but `@` (so `/` and `:` too; a digest must be
written out); nothing else is special. A registry on the engine's own host or its networks
(loopback, private and link-local addresses, `localhost`) is matched only by a pattern that
names that host before its first `/`: `*` alone never sends a pull there.
References and patterns are compared in their normal form: `docker.io/library/` and
`docker.io/` dropped, `:latest` added to a reference with neither tag nor digest.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Collection, Mapping
from typing import Any

from sandboxd.errors import FailedPrecondition, PermissionDenied
from sandboxd.reasons import Reason
from sandboxd.registry import Reference
from sandboxd.validation.image_refs import normalize_reference, parse_patterns

__all__ = [
    "HEALTHCHECK_OFF",
    "PRIVATE_REPOSITORIES",
    "SNAPSHOT_REPOSITORY",
    "TEMPLATE_REPOSITORY",
    "allowed_patterns",
    "check_image",
    "normalize_reference",
    "parse_patterns",
    "refuse_volumes",
]

# Container config that switches off any HEALTHCHECK the image declares (commands the
# supervisor would not see): `config["Healthcheck"] = HEALTHCHECK_OFF`.
HEALTHCHECK_OFF: dict[str, list[str]] = {"Test": ["NONE"]}

_ID_RE = re.compile(r"\A(?:sha256:)?([0-9a-f]{12,64})\Z")
MIN_ID_PREFIX = 12

# The repositories the server tags its own images in: never a caller's to name.
TEMPLATE_REPOSITORY = "sandboxd-template"
SNAPSHOT_REPOSITORY = "sandboxd-snapshot"
PRIVATE_REPOSITORIES = frozenset({TEMPLATE_REPOSITORY, SNAPSHOT_REPOSITORY})


def allowed_patterns(
    server_allowlist: str,
    tenant_allowlist: str | None,
    *,
    default_image: str = "",
) -> tuple[str, ...]:
    """The server's `image_allowlist`, its default `image` (the operator chose it), and the
    tenant's `image_allowlist=` from the tokens file (the caller passes the current grant)."""
    texts = [server_allowlist, tenant_allowlist or ""]
    default = (normalize_reference(default_image),) if default_image else ()
    return parse_patterns(",".join(texts)) + default


def _matches(pattern: str, ref: str) -> bool:
    regex = "[^@]*".join(re.escape(part) for part in pattern.split("*"))
    if re.fullmatch(regex, ref) is None:
        return False
    registry = Reference.parse(ref).registry
    return not _on_host_network(registry) or pattern.split("/", 1)[0] == registry


def _on_host_network(registry: str) -> bool:
    """Whether a registry host is on the engine's own host or its networks: loopback, a
    private, link-local or otherwise not global address (as the C resolver reads it, so
    `127.1` too), or a `localhost` name. The engine pulls from its host's network, so a
    wildcard is no operator's consent to that: only a pattern that names the host is."""
    if registry.startswith("["):  # [v6]:port
        host = registry[1:].partition("]")[0]
    else:
        host = registry.rsplit(":", 1)[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:  # the legacy spellings inet_aton takes and a resolver passes on: 127.1, 0x7f.1
            address = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return False  # a name: the engine resolves it (SECURITY.md, "Registry pulls")
    return not address.is_global


def _own_snapshot(image: str, own_images: Collection[str]) -> bool:
    m = _ID_RE.match(image)
    if m is None:
        return False
    wanted = m.group(1)
    for own in own_images:
        own_id = own.removeprefix("sha256:")
        if own_id.startswith(wanted) and len(wanted) >= MIN_ID_PREFIX:
            return True
    return False


def check_image(
    image: str,
    patterns: Collection[str],
    *,
    own_images: Collection[str] = (),
) -> None:
    """Refuse (PERMISSION_DENIED, IMAGE_NOT_ALLOWED) an image outside the allowlist.

    `patterns`: the tenant's allowlist (from the tokens file) or else the server's;
    `own_images`: image ids of the calling tenant's snapshots.
    """
    if _own_snapshot(image, own_images):
        return
    if _ID_RE.match(image) is None:
        ref = normalize_reference(image)
        private = Reference.parse(ref).name in PRIVATE_REPOSITORIES
        if not private and any(_matches(p, ref) for p in patterns):
            return
    raise PermissionDenied(
        f"image {image[:200]!r} is not on this server's image allowlist; ask the operator "
        "(setting image_allowlist, or image_allowlist= in the tokens file)",
        reason=Reason.IMAGE_NOT_ALLOWED,
        metadata={"image": image[:200]},
    )


def refuse_volumes(image: str, inspected: Mapping[str, Any]) -> None:
    """Refuse (FAILED_PRECONDITION, IMAGE_HAS_VOLUMES) an image whose config declares VOLUMEs.

    `inspected`: the engine's image inspect answer (`Config.Volumes`).
    """
    config = inspected.get("Config") or {}
    volumes = config.get("Volumes") or {}
    if volumes:
        names = ", ".join(sorted(str(v) for v in volumes))[:300]
        raise FailedPrecondition(
            f"image {image[:200]!r} declares VOLUMEs ({names}): volumes are host disk outside "
            "the session's limits, so such images are refused",
            reason=Reason.IMAGE_HAS_VOLUMES,
            metadata={"image": image[:200], "volumes": names},
        )
