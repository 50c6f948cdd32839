"""Registry pulls on the engine fake: policies, one shared pull, the size cap, digests and the
sweep (sandboxd.pulls), and the reference/credential parsing of sandboxd.registry. No Docker."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd.config import Config
from sandboxd.engine.docker_pull import pull_error
from sandboxd.errors import FailedPrecondition, NotFound, ResourceExhausted
from sandboxd.models import PullPolicy, SessionState
from sandboxd.pulls import Pulls
from sandboxd.reasons import Reason
from sandboxd.registry import Reference, RemoteManifest, load_credentials
from sandboxd.sessions import CreateSessionInput, SessionManager
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper
from sandboxd.store import SessionStore

REF = "reg.test:5000/team/tools:v1"
DIGEST = "sha256:" + "a" * 64
MOVED = "sha256:" + "b" * 64


class StubRegistry:
    """What the registry answers for the manifest: a digest and the declared size."""

    def __init__(self, digest: str = DIGEST, size: int | None = 300) -> None:
        self.digest, self.size, self.asked = digest, size, 0

    async def resolve(self, ref: Reference, auth: object) -> RemoteManifest:
        self.asked += 1
        return RemoteManifest(self.digest, self.size)


def _pulls(tmp_path: Path, engine: FakeEngine, registry: StubRegistry, **settings: object) -> Pulls:
    config = Config(data_dir=tmp_path, **settings)
    return Pulls(config, engine, registry=registry)  # type: ignore[arg-type]


async def test_if_not_present_pulls_once_and_records_the_digest(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    engine.remote[REF] = (DIGEST, (100, 200))
    pulls = _pulls(tmp_path, engine, registry)
    first = await pulls.ensure(REF, PullPolicy.IF_NOT_PRESENT)
    assert first.digest == DIGEST and first.image_id
    again = await pulls.ensure(REF, PullPolicy.IF_NOT_PRESENT)
    assert again == first
    assert engine.calls.count("pull_image") == 1 and registry.asked == 1


async def test_concurrent_creates_share_one_pull(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    engine.remote[REF] = (DIGEST, (100,) * 20)
    pulls = _pulls(tmp_path, engine, registry)
    results = await asyncio.gather(
        *(pulls.ensure(REF, PullPolicy.IF_NOT_PRESENT) for _ in range(5))
    )
    assert {r.digest for r in results} == {DIGEST}
    assert engine.calls.count("pull_image") == 1


async def test_never_refuses_an_absent_image_without_asking_anyone(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    engine.remote[REF] = (DIGEST, (100,))
    with pytest.raises(FailedPrecondition) as err:
        await _pulls(tmp_path, engine, registry).ensure(REF, PullPolicy.NEVER)
    assert err.value.reason == Reason.IMAGE_NOT_FOUND
    assert registry.asked == 0 and "pull_image" not in engine.calls


async def test_always_pulls_only_when_the_tag_moved(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    engine.remote[REF] = (DIGEST, (100,))
    pulls = _pulls(tmp_path, engine, registry)
    await pulls.ensure(REF, PullPolicy.ALWAYS)
    await pulls.ensure(REF, PullPolicy.ALWAYS)
    assert engine.calls.count("pull_image") == 1 and registry.asked == 2
    registry.digest = MOVED
    engine.remote[REF] = (MOVED, (100,))
    moved = await pulls.ensure(REF, PullPolicy.ALWAYS)
    assert moved.digest == MOVED and engine.calls.count("pull_image") == 2


async def test_size_cap_from_the_manifest_before_any_layer(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry(size=5000)
    engine.remote[REF] = (DIGEST, (5000,))
    with pytest.raises(ResourceExhausted) as err:
        await _pulls(tmp_path, engine, registry, max_image_bytes=1000).ensure(
            REF, PullPolicy.IF_NOT_PRESENT
        )
    assert err.value.reason == Reason.IMAGE_TOO_LARGE
    assert "pull_image" not in engine.calls


async def test_size_cap_enforced_during_the_pull_when_the_manifest_is_silent(
    tmp_path: Path,
) -> None:
    engine, registry = FakeEngine(), StubRegistry(size=None)
    engine.remote[REF] = (DIGEST, (600, 600))
    with pytest.raises(ResourceExhausted) as err:
        await _pulls(tmp_path, engine, registry, max_image_bytes=1000).ensure(
            REF, PullPolicy.IF_NOT_PRESENT
        )
    assert err.value.reason == Reason.IMAGE_TOO_LARGE
    assert REF not in engine.images  # abandoned before it completed


async def test_a_missing_image_is_the_registry_reason(tmp_path: Path) -> None:
    engine = FakeEngine()
    with pytest.raises(NotFound) as err:
        await _pulls(tmp_path, engine, StubRegistry()).ensure(REF, PullPolicy.IF_NOT_PRESENT)
    assert err.value.reason == Reason.REGISTRY_IMAGE_NOT_FOUND


async def test_sweep_removes_unused_pulled_images_but_not_needed_ones(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    other = "reg.test:5000/team/other:v1"
    engine.remote[REF] = (DIGEST, (100,))
    engine.remote[other] = (DIGEST, (100,))
    needed = {"reg.test:5000/team/other:v1"}

    async def live() -> set[str]:
        return needed

    config = Config(data_dir=tmp_path, image_unused_after_s=0)
    pulls = Pulls(config, engine, registry=registry, live_images=live)  # type: ignore[arg-type]
    await pulls.ensure(REF, PullPolicy.IF_NOT_PRESENT)
    await pulls.ensure(other, PullPolicy.IF_NOT_PRESENT)
    assert await pulls.sweep() == 1
    assert REF not in engine.images and other in engine.images
    # The records survive a restart: a new Pulls reads them back.
    again = Pulls(config, engine, registry=registry)  # type: ignore[arg-type]
    assert set(again.records.by_name) == {other}


@pytest.mark.parametrize(
    ("ref", "registry", "repository", "tag", "digest"),
    [
        ("python:3.12", "docker.io", "library/python", "3.12", ""),
        ("busybox", "docker.io", "library/busybox", "latest", ""),
        ("team/app:1", "docker.io", "team/app", "1", ""),
        ("127.0.0.1:5000/rt:v1", "127.0.0.1:5000", "rt", "v1", ""),
        ("localhost/a/b", "localhost", "a/b", "latest", ""),
        (f"reg.io/x@{DIGEST}", "reg.io", "x", "", DIGEST),
    ],
)
def test_reference_parse(ref: str, registry: str, repository: str, tag: str, digest: str) -> None:
    r = Reference.parse(ref)
    assert (r.registry, r.repository, r.tag, r.digest) == (registry, repository, tag, digest)


def test_loopback_registries_are_plain_http_only() -> None:
    assert Reference.parse("127.0.0.1:5000/rt").is_loopback()
    assert Reference.parse("localhost:5000/rt").is_loopback()
    assert not Reference.parse("reg.example.com/rt").is_loopback()
    assert not Reference.parse("python:3").is_loopback()


def test_credentials_file_in_docker_config_format(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    pair = base64.b64encode(b"user:pa:ss").decode()
    path.write_text(
        json.dumps(
            {
                "auths": {
                    "127.0.0.1:5000": {"auth": pair},
                    "https://index.docker.io/v1/": {"username": "u", "password": "p"},
                }
            }
        )
    )
    found = load_credentials(path)
    assert found["127.0.0.1:5000"] == {"username": "user", "password": "pa:ss"}
    assert found["docker.io"] == {"username": "u", "password": "p"}
    path.write_text("{not json secret-password")
    with pytest.raises(FailedPrecondition) as err:
        load_credentials(path)
    assert "secret-password" not in str(err.value)


@contextlib.asynccontextmanager
async def _manager(
    tmp_path: Path, engine: FakeEngine, registry: StubRegistry
) -> AsyncIterator[tuple[SessionManager, SessionStore]]:
    config = Config(data_dir=tmp_path, image_allowlist="reg.test:5000/*")
    async with SessionStore(tmp_path / "sessions.db") as store:
        snap_store = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snap_store, FakeArchive(engine), engine, "sbxunit")
        pulls = Pulls(config, engine, registry=registry)  # type: ignore[arg-type]
        commands = FakeCommands(engine)
        yield (
            SessionManager(
                config, engine, store, "sbxunit", keeper, pulls=pulls, commands=commands
            ),
            store,
        )
        await pulls.close()


async def test_create_pulls_and_records_the_digest_in_the_session(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry()
    engine.remote[REF] = (DIGEST, (100,))
    async with _manager(tmp_path, engine, registry) as (sessions, store):
        s = await sessions.create(CreateSessionInput(image=REF))
        assert s.state is SessionState.RUNNING and s.spec.image_digest == DIGEST
        stored = await store.get(s.session_id)
        assert stored is not None and stored.spec.image_digest == DIGEST
        assert stored.spec.image_id and stored.fingerprint == s.spec.fingerprint()


async def test_a_failed_pull_leaves_no_session_behind(tmp_path: Path) -> None:
    engine, registry = FakeEngine(), StubRegistry(size=10**12)
    engine.remote[REF] = (DIGEST, (100,))
    async with _manager(tmp_path, engine, registry) as (sessions, store):
        with pytest.raises(ResourceExhausted):
            await sessions.create(CreateSessionInput(session_id="s1", image=REF))
        assert await store.get("s1") is None and engine.sandboxes == {}
        with pytest.raises(FailedPrecondition) as err:
            await sessions.create(
                CreateSessionInput(session_id="s1", image=REF, pull_policy=PullPolicy.NEVER)
            )
        assert err.value.reason == Reason.IMAGE_NOT_FOUND
        assert await store.get("s1") is None and engine.sandboxes == {}


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (
            404,
            "manifest for 127.0.0.1:5000/rt:x not found: manifest unknown",
            "REGISTRY_IMAGE_NOT_FOUND",
        ),
        (
            500,
            "pull access denied for nope, repository does not exist or may require 'docker login'",
            "REGISTRY_IMAGE_NOT_FOUND",
        ),
        (500, "unauthorized: authentication required", "REGISTRY_UNAUTHORIZED"),
        (500, "no basic auth credentials", "REGISTRY_UNAUTHORIZED"),
        (
            500,
            'Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
            "REGISTRY_UNREACHABLE",
        ),
        (
            500,
            "no matching manifest for linux/amd64 in the manifest list entries",
            "IMAGE_PULL_FAILED",
        ),
    ],
)
def test_engine_pull_errors_get_their_reason(status: int, message: str, reason: str) -> None:
    err = pull_error("127.0.0.1:5000/rt:x", status, message)
    assert err.reason == reason
