"""What template builds and image snapshots may write to the engine's disk, on the engine
fake: a build stops at max_image_bytes while it runs (not only once it is done) and at the
tenant's image quota, leaving no image behind; image snapshots count against the same quota."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.errors import ResourceExhausted
from sandboxd.sessions import CreateSessionInput
from sandboxd.store import SessionStore
from sandboxd.templates import build_run
from sandboxd.templates.builds import LABEL_BUILD, Templates
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateState, TemplateStore
from session_stack import session_stack

CAP = 50_000  # max_image_bytes in these tests; the fake's base images are 1000 bytes


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


class Env:
    def __init__(self, templates: Templates, engine: FakeEngine, snapshots: list[str]):
        self.templates, self.engine, self.snapshots = templates, engine, snapshots

    async def build(self, name: str, text: str) -> object:
        return [e async for e in self.templates.build(name, text, _nothing())][-1]

    def build_images(self) -> list[str]:
        return [n for n, labels in self.engine.images.items() if LABEL_BUILD in labels]


@pytest.fixture
def settings() -> dict[str, object]:
    return {"tenant_max_image_bytes": 0, "watch_every_s": 0.005}


@pytest.fixture
async def env(tmp_path: Path, settings: dict[str, object]) -> AsyncIterator[Env]:
    engine = FakeEngine()
    engine.build_step_s = 0.05  # each step takes long enough for the watcher to measure
    snapshots: list[str] = []

    async def snapshot_images(tenant: str) -> list[str]:
        return list(snapshots)

    async def in_use(tenant: str, name: str) -> bool:
        return False

    config = Config(
        data_dir=tmp_path,
        max_image_bytes=CAP,
        tenant_max_image_bytes=int(str(settings["tenant_max_image_bytes"])),
    )
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        quota = ImageQuota(config.tenancy.max_image_bytes, engine, tstore, snapshot_images)
        templates = Templates(
            config,
            engine,
            tstore,
            tmp_path / "spool",
            in_use,
            quota=quota,
            settle_s=0,
            watch_every_s=float(str(settings["watch_every_s"])),
        )
        yield Env(templates, engine, snapshots)
        await templates.wait_cleanups()
        await templates.close()


async def test_a_build_is_stopped_while_it_writes_past_max_image_bytes(env: Env) -> None:
    with pytest.raises(ResourceExhausted) as info:
        await env.build("big", "FROM busybox\nRUN write 100000\nRUN echo after\n")
    assert info.value.reason == "IMAGE_TOO_LARGE"
    assert "max_image_bytes" in info.value.message
    assert "RUN echo after" not in env.engine.build_steps  # stopped, not left to finish
    assert env.build_images() == []  # nothing of the build is left
    got = await env.templates.get("big")
    assert got.state is TemplateState.FAILED and "max_image_bytes" in got.message


@pytest.mark.parametrize(
    "settings", [{"tenant_max_image_bytes": 0, "watch_every_s": 3600.0}], indirect=False
)
async def test_the_finished_image_is_measured_once_more(env: Env) -> None:
    """Written between two measures (here: never measured while it ran), the image is still
    refused once it is made, and removed."""
    with pytest.raises(ResourceExhausted) as info:
        await env.build("late", "FROM busybox\nRUN write 100000\n")
    assert info.value.reason == "IMAGE_TOO_LARGE"
    assert env.build_images() == []
    assert "RUN write 100000" in env.engine.build_steps


async def test_a_build_under_the_cap_is_kept_with_its_size(env: Env) -> None:
    done = await env.build("fits", "FROM busybox\nRUN write 20000\n")
    assert getattr(done, "size_bytes", 0) == 21000


@pytest.mark.parametrize(
    "settings", [{"tenant_max_image_bytes": 30_000, "watch_every_s": 0.005}], indirect=False
)
async def test_the_tenant_quota_counts_templates_and_image_snapshots(env: Env) -> None:
    await env.build("one", "FROM busybox\nRUN write 19000\n")  # 20000 of 30000
    with pytest.raises(ResourceExhausted) as info:
        await env.build("two", "FROM busybox\nRUN write 19000\nRUN echo after\n")
    assert info.value.reason == "TENANT_IMAGE_QUOTA"
    assert "tenant_max_image_bytes" in info.value.message
    assert "RUN echo after" not in env.engine.build_steps
    assert [n for n in env.build_images() if not n.startswith("sandboxd-template:")] == []
    assert (await env.templates.get("one")).state is TemplateState.READY

    # Rebuilding a template counts the new image instead of the one it replaces.
    await env.build("one", "FROM busybox\nRUN write 25000\n")

    # Image snapshots are the tenant's images too: with 4000 of room left and a 5000-byte
    # snapshot image, no build may start.
    env.engine.image_sizes["snap-image"] = 5000
    env.engine.images["snap-image"] = {}
    env.snapshots.append("snap-image")
    builds_before = len(env.engine.builds)
    with pytest.raises(ResourceExhausted) as info:
        await env.build("three", "FROM busybox\n")
    assert info.value.reason == "TENANT_IMAGE_QUOTA"
    assert len(env.engine.builds) == builds_before  # refused before the engine built a thing


async def test_the_quota_is_the_tenants_own(env: Env, tmp_path: Path) -> None:
    """Another tenant's images do not count against this one's quota."""
    assert (await env.templates._quota.used(tenancy.current())) == 0
    await env.build("mine", "FROM busybox\nRUN write 1000\n")
    assert await env.templates._quota.used("someone-else") == 0


def _snapshot_quota_config(tmp_path: Path, quota: int, cap: int) -> dict[str, object]:
    config = Config(data_dir=tmp_path, tenant_max_image_bytes=quota, max_image_bytes=cap)
    return {"tenancy": config.tenancy, "images": config.images}


async def test_an_image_snapshot_over_the_quota_is_taken_back(tmp_path: Path) -> None:
    settings = _snapshot_quota_config(tmp_path, 2500, 10_000)
    async with session_stack(tmp_path, **settings) as st:
        await st.sessions.create(CreateSessionInput(session_id="s1"))
        st.engine.commit_bytes = 1000
        first = await st.snapshots.create("s1", {}, "IMAGE")  # 1000 of 2500
        second = await st.snapshots.create("s1", {}, "IMAGE")  # 2000 of 2500
        with pytest.raises(ResourceExhausted) as info:
            await st.snapshots.create("s1", {}, "IMAGE")  # would be 3000
        assert info.value.reason == "TENANT_IMAGE_QUOTA"
        kept = {s.snapshot_id for s in await st.snap_store.of_session("s1")}
        assert kept == {first.snapshot_id, second.snapshot_id}  # the third was taken back
        images = {i for i in st.engine.images if i.startswith("sha256:")}
        assert images == {first.image, second.image}
        await st.snapshots.create("s1", {}, "")  # a TAR snapshot is not an image: not counted
        await st.snapshots.delete(first.snapshot_id)
        await st.snapshots.create("s1", {}, "IMAGE")  # room again


async def test_an_image_snapshot_over_max_image_bytes_is_refused(tmp_path: Path) -> None:
    settings = _snapshot_quota_config(tmp_path, 0, 5000)
    async with session_stack(tmp_path, **settings) as st:
        await st.sessions.create(CreateSessionInput(session_id="s1"))
        st.engine.commit_bytes = 6000
        with pytest.raises(ResourceExhausted) as info:
            await st.snapshots.create("s1", {}, "IMAGE")
        assert info.value.reason == "IMAGE_TOO_LARGE"
        assert await st.snap_store.of_session("s1") == []
        assert not [i for i in st.engine.images if i.startswith("sha256:")]


def test_the_setting_has_a_default() -> None:
    assert Config().tenancy.max_image_bytes == 20 * 1024**3
    assert dataclasses.is_dataclass(Config().tenancy)


def test_a_steps_file_size_limit_is_the_room_left_above_its_base() -> None:
    over_quota = ImageQuota(1, FakeEngine(), None, None).refused  # type: ignore[arg-type]
    by_cap = build_run.SizeLimit(room=10_000, cap=5000, base_bytes=1000)
    assert by_cap.file_bytes == 4000
    assert by_cap.file_limit_refused("t", over_quota).reason == "IMAGE_TOO_LARGE"
    by_quota = build_run.SizeLimit(room=3000, cap=5000, base_bytes=1000)
    assert by_quota.file_bytes == 2000
    assert by_quota.file_limit_refused("t", over_quota).reason == "TENANT_IMAGE_QUOTA"
    assert build_run.SizeLimit(room=10, cap=5000, base_bytes=1000).file_bytes == 1
    assert build_run.hit_file_limit(["dd: error writing '/big': File too large"])
    assert not build_run.hit_file_limit(["returned a non-zero code: 1"])


async def test_shutdown_runs_the_late_prune_of_a_stopped_build(tmp_path: Path) -> None:
    """A stopped build's last commit may land after it was pruned: the prune again after the
    settle time also runs when the server shuts down within it."""
    engine = FakeEngine()
    engine.build_step_s = 0.05

    async def none(tenant: str) -> list[str]:
        return []

    async def in_use(tenant: str, name: str) -> bool:
        return False

    config = Config(data_dir=tmp_path, max_image_bytes=CAP)
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        templates = Templates(
            config,
            engine,
            tstore,
            tmp_path / "spool",
            in_use,
            quota=ImageQuota(0, engine, tstore, none),
            settle_s=0.2,
            watch_every_s=0.005,
        )
        with pytest.raises(ResourceExhausted):
            async for _ in templates.build("big", "FROM busybox\nRUN write 100000\n", _nothing()):
                pass
        record = await tstore.get(tenancy.current(), "big")
        assert record is not None and record.build_id
        build_id = record.build_id
        engine.images["late-commit"] = {LABEL_BUILD: build_id}  # the engine's late commit
        await templates.close()  # at once: within the settle time
        assert "late-commit" not in engine.images
