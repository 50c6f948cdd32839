"""The operator's image allowlist: patterns, the tenant's own snapshot images,
images with VOLUMEs refused, health checks switched off."""

from __future__ import annotations

import pytest
from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.errors import FailedPrecondition, PermissionDenied
from sandboxd.images import (
    HEALTHCHECK_OFF,
    allowed_patterns,
    check_image,
    normalize_reference,
    parse_patterns,
    refuse_volumes,
)

DEFAULT = parse_patterns(Config().images.allowlist)
OPERATOR = parse_patterns("127.0.0.1:5000/*, python:3.*,docker.io/library/alpine:3.21")
OWN = ("sha256:" + "ab" * 32,)
OTHER = "sha256:" + "cd" * 32


@pytest.mark.parametrize(
    ("ref", "normal"),
    [
        ("python", "python:latest"),
        ("docker.io/library/python:3.12", "python:3.12"),
        ("docker.io/team/tool", "team/tool:latest"),
        ("127.0.0.1:5000/tool", "127.0.0.1:5000/tool:latest"),
        ("127.0.0.1:5000/tool:1", "127.0.0.1:5000/tool:1"),
        ("alpine@sha256:" + "0" * 64, "alpine@sha256:" + "0" * 64),
    ],
)
def test_normalize_reference(ref: str, normal: str) -> None:
    assert normalize_reference(ref) == normal


@pytest.mark.parametrize(
    "image", ["sandboxd-runtime:busybox", "sandboxd-runtime:python", *OWN, OWN[0][7:19]]
)
def test_default_allows_the_runtime_images_and_own_snapshots(image: str) -> None:
    check_image(image, DEFAULT, own_images=OWN)


@pytest.mark.parametrize(
    "image",
    [
        "alpine:3.21",  # an unrelated local image
        "python",
        "evil/sandboxd-runtime:busybox",
        "sandboxd-runtime:busybox@sha256:" + "0" * 64,  # a digest names any content
        OTHER,  # another tenant's snapshot image
        OTHER[7:19],  # ... by a short id
        OTHER[7:],
        OWN[0][7:15],  # too short a prefix to name one image
    ],
)
def test_default_refuses_everything_else(image: str) -> None:
    with pytest.raises(PermissionDenied) as excinfo:
        check_image(image, DEFAULT, own_images=OWN)
    assert excinfo.value.reason == "IMAGE_NOT_ALLOWED"


def test_operator_patterns() -> None:
    for image in ("127.0.0.1:5000/team/tool:2", "python:3.12", "alpine:3.21"):
        check_image(image, OPERATOR)
    for image in ("127.0.0.2:5000/tool:1", "python:2.7", "python", "alpine:3.20"):
        with pytest.raises(PermissionDenied):
            check_image(image, OPERATOR)


@pytest.mark.parametrize("text", ["Bad!", "python:3.* ,UPPER", "a b", "x" * 300])
def test_bad_patterns_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_patterns(text)


def test_images_with_volumes_refused() -> None:
    refuse_volumes("ok:1", {"Config": {"Volumes": None}})
    refuse_volumes("ok:1", {"Config": {}})
    with pytest.raises(FailedPrecondition) as excinfo:
        refuse_volumes("db:1", {"Config": {"Volumes": {"/var/lib/data": {}}}})
    assert excinfo.value.reason == "IMAGE_HAS_VOLUMES"
    assert "/var/lib/data" in excinfo.value.message


def test_health_checks_off() -> None:
    assert HEALTHCHECK_OFF == {"Test": ["NONE"]}


def test_a_tenants_allowlist_adds_to_the_servers() -> None:
    alpha = tenancy.TenantGrants(image_allowlist="python:3.*")
    check_image("python:3.12", allowed_patterns("sandboxd-runtime:*", alpha.image_allowlist))
    check_image(
        "sandboxd-runtime:busybox", allowed_patterns("sandboxd-runtime:*", alpha.image_allowlist)
    )
    with pytest.raises(PermissionDenied):  # another tenant (or the local one) has no such grant
        check_image(
            "python:3.12",
            allowed_patterns("sandboxd-runtime:*", tenancy.TenantGrants().image_allowlist),
        )
    with pytest.raises(PermissionDenied):
        check_image("python:3.12", allowed_patterns("sandboxd-runtime:*", None))


def test_the_operators_default_image_is_allowed() -> None:
    patterns = allowed_patterns("sandboxd-runtime:*", None, default_image="alp")
    check_image("alp", patterns)
    check_image("docker.io/library/alp:latest", patterns)
    with pytest.raises(PermissionDenied):
        check_image("alp:2", patterns)


@pytest.mark.parametrize(
    "image",
    [
        "sandboxd-template:0123456789abcdef",  # another tenant's template build
        "sandboxd-snapshot:0123456789abcdef",  # another tenant's snapshot
        "docker.io/library/sandboxd-template:0123456789abcdef",
        "library/sandboxd-snapshot:0123456789abcdef",
        "sandboxd-template",
        "sandboxd-snapshot@sha256:" + "0" * 64,
    ],
)
@pytest.mark.parametrize("pattern", ["*", "sandboxd-*", "sandboxd-template:*,sandboxd-snapshot*"])
def test_the_servers_own_repositories_are_refused_whatever_the_allowlist(
    image: str, pattern: str
) -> None:
    with pytest.raises(PermissionDenied) as excinfo:
        check_image(image, parse_patterns(pattern), own_images=OWN)
    assert excinfo.value.reason == "IMAGE_NOT_ALLOWED"


@pytest.mark.parametrize(
    "image, pattern",
    [
        ("sandboxd-runtime:busybox", "*"),
        ("python:3.12", "*"),
        ("ghcr.io/org/tool:1", "*"),
        ("127.0.0.1:5000/sandboxd-template:1", "127.0.0.1:5000/*"),
        ("10.1.2.3:5000/rt:1", "10.1.2.3:5000/rt*"),
    ],
)
def test_a_wide_allowlist_still_allows_the_runtime_and_registry_images(
    image: str, pattern: str
) -> None:
    check_image(image, parse_patterns(pattern))


@pytest.mark.parametrize(
    "image",
    [
        "127.0.0.1:5000/rt:1",
        "127.1:5000/rt:1",
        "localhost:5000/rt:1",
        "localhost/rt:1",
        "[::1]:5000/rt:1",
        "10.0.0.7/rt:1",
        "192.168.1.1:443/rt:1",
        "169.254.169.254/latest:1",
        "100.64.0.1:80/rt:1",
        "[fe80::1]:5000/rt:1",
        "0.0.0.0:2375/rt:1",
    ],
)
@pytest.mark.parametrize("pattern", ["*", "*/*", "*:*", "*/rt:*", "1*", "l*"])
def test_a_wildcard_never_names_a_registry_on_the_hosts_own_network(
    image: str, pattern: str
) -> None:
    """The engine pulls from its own host's network: a registry on loopback, a private or
    link-local address is reached only where the operator's pattern names that host."""
    with pytest.raises(PermissionDenied) as excinfo:
        check_image(image, parse_patterns(pattern))
    assert excinfo.value.reason == "IMAGE_NOT_ALLOWED"
