"""Callers pick only allowlisted images (the runtime images, the operator's
patterns, their own snapshot images); images with VOLUMEs are refused; HEALTHCHECKs never run.

The policy itself is `sandboxd.images` (tests/unit/test_images.py); session create checks it
before asking the engine, the Docker adapter refuses images with VOLUMEs and turns health
checks off.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import grpc
import pytest
from authutil import tenant_fixture, write_tokens
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    own_server,
)
from containers import session_containers
from sandboxd.v1 import common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

ALPHA = "alpha-" + secrets.token_urlsafe(24)
BETA = "beta-" + secrets.token_urlsafe(24)
TAG = secrets.token_hex(4)


def _build(tag: str, instruction: str) -> str:
    dockerfile = f"FROM {IMAGE}\n{instruction}\n"
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, "-"],
        input=dockerfile,
        text=True,
        check=True,
        capture_output=True,
    )
    return tag


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    made = {
        "other": f"sandboxd-test-other:{TAG}",
        "volume": f"sandboxd-runtime:test-volume-{TAG}",
        "health": f"sandboxd-runtime:test-health-{TAG}",
    }
    subprocess.run(["docker", "tag", IMAGE, made["other"]], check=True, capture_output=True)
    _build(made["volume"], "VOLUME /data")
    _build(made["health"], 'HEALTHCHECK --interval=1s CMD ["touch", "/tmp/health-ran"]')
    yield made
    subprocess.run(["docker", "rmi", "-f", *made.values()], capture_output=True, check=False)


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("hostile-images")
    tokens = write_tokens(data / "tokens", {ALPHA: "alpha", BETA: "beta"})
    owner = "himg" + secrets.token_hex(4)
    with own_server(data / "data", owner, "--tokens-file", str(tokens)) as srv:
        yield srv


alpha = tenant_fixture("image_server", ALPHA)


beta = tenant_fixture("image_server", BETA)


def _create(s: Stubs, image: str) -> str:
    resp = s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True), image=image)
    )
    return str(resp.session.session_id)


def test_unlisted_and_other_tenants_images_refused(
    alpha: Stubs, beta: Stubs, images: dict[str, str]
) -> None:
    expect_error(
        lambda: _create(alpha, images["other"]),
        grpc.StatusCode.PERMISSION_DENIED,
        "IMAGE_NOT_ALLOWED",
    )
    sid = _create(alpha, IMAGE)
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(alpha.channel)
    snap = snaps.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=snapshot_pb2.SNAPSHOT_KIND_IMAGE)
    ).snapshot
    assert snap.image
    for image in (snap.image, snap.image.removeprefix("sha256:")[:12]):
        expect_error(
            lambda image=image: _create(beta, image),  # type: ignore[misc]
            grpc.StatusCode.PERMISSION_DENIED,
            "IMAGE_NOT_ALLOWED",
        )
    own = _create(alpha, snap.image)  # a tenant's own snapshot image is its to use
    for done in (own, sid):
        alpha.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=done))


def test_images_with_volumes_refused(alpha: Stubs, images: dict[str, str]) -> None:
    expect_error(
        lambda: _create(alpha, images["volume"]),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IMAGE_HAS_VOLUMES",
    )


def test_health_checks_never_run(alpha: Stubs, images: dict[str, str]) -> None:
    sid = _create(alpha, images["health"])
    try:
        resp = alpha.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid))
        name = session_containers(sid, running=True)
        assert resp.session.session_id == sid and name
        health = subprocess.run(
            ["docker", "inspect", "-f", "{{json .Config.Healthcheck}}", name[0]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert '"NONE"' in health, health
    finally:
        alpha.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
