"""Template builds on the engine fake (sandboxd.templates.builds): records, the rewritten
Dockerfile, cleanup of failed builds, the per-tenant cap, tenants, and delete rules."""

from __future__ import annotations

import asyncio
import gzip
import io
import subprocess
import tarfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import context_polyglots
import pytest
from fakes import FakeEngine
from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from sandboxd.store import SessionStore
from sandboxd.templates.builds import LABEL_BUILD, BuildLog, Templates
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateRecord, TemplateState, TemplateStore


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Env:
    def __init__(self, templates: Templates, engine: FakeEngine, used: set[tuple[str, str]]):
        self.templates, self.engine, self.used = templates, engine, used

    async def build(self, name: str, text: str, *parts: bytes) -> list[BuildLog | TemplateRecord]:
        return [e async for e in self.templates.build(name, text, _chunks(*parts))]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    engine = FakeEngine()
    used: set[tuple[str, str]] = set()

    async def in_use(tenant: str, name: str) -> bool:
        return (tenant, name) in used

    config = Config(data_dir=tmp_path, template_max_context_bytes=16384, template_max_builds=1)
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        quota = ImageQuota(0, engine, tstore, _no_snapshots)
        templates = Templates(
            config, engine, tstore, tmp_path / "spool", in_use, quota=quota, settle_s=0
        )
        yield Env(templates, engine, used)
        await templates.wait_cleanups()
        await templates.close()


async def test_build_records_and_rewrites_from(env: Env) -> None:
    events = await env.build("web", "FROM busybox\nCOPY a /a\n", _tar({"a": b"1"}))
    *logs, done = events
    assert all(isinstance(e, BuildLog) for e in logs) and logs
    assert isinstance(done, TemplateRecord) and done.state is TemplateState.READY
    (built,) = env.engine.builds
    busybox = await env.engine.inspect_image("sandboxd-runtime:busybox")
    assert busybox is not None
    assert built.splitlines()[0] == f"FROM {busybox.image_id}"  # the base as inspected
    assert built.splitlines()[1].startswith(f"LABEL {LABEL_BUILD}=")
    assert (await env.templates.get("web")).image == done.image
    assert await env.templates.ready_images(tenancy.current()) == {"web": done.image}
    assert list((env.templates._spool_dir).iterdir()) == []  # the spooled context is gone


async def test_failed_build_leaves_no_image_and_a_failed_record(env: Env) -> None:
    before = set(env.engine.images)
    with pytest.raises(FailedPrecondition) as info:
        await env.build("bad", "FROM busybox\nRUN echo\nRUN false\n")
    assert info.value.reason == "TEMPLATE_BUILD_FAILED"
    assert set(env.engine.images) == before  # the intermediate was pruned by its label
    got = await env.templates.get("bad")
    assert got.state is TemplateState.FAILED and "non-zero" in got.message


async def test_context_over_cap(env: Env) -> None:
    with pytest.raises(ResourceExhausted) as info:
        await env.build("big", "FROM busybox\n", b"x" * 9000, b"y" * 9000)
    assert info.value.reason == "TEMPLATE_CONTEXT_TOO_LARGE"
    assert env.engine.builds == []


async def test_concurrent_builds_capped_per_tenant(env: Env) -> None:
    gate = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        await gate.wait()
        yield b""

    held = env.templates.build("one", "FROM busybox\n", slow())
    first = asyncio.ensure_future(anext(held))
    await asyncio.sleep(0.05)
    with pytest.raises(ResourceExhausted) as info:
        await env.build("two", "FROM busybox\n")
    assert info.value.reason == "TEMPLATE_BUILDS_BUSY"

    async def other_tenant() -> list[BuildLog | TemplateRecord]:
        tenancy.use_tenant("beta")
        return await env.build("two", "FROM busybox\n")

    assert await asyncio.create_task(other_tenant())  # the cap is per tenant
    gate.set()
    await first
    await held.aclose()


async def test_from_rules_resolve(env: Env) -> None:
    with pytest.raises(InvalidArgument) as info:
        await env.build("x", "FROM alpine:3.19\n")  # not on the allowlist
    assert info.value.reason == "TEMPLATE_FROM_NOT_ALLOWED"
    await env.build("parent", "FROM busybox\n")
    await env.build("child", "FROM parent\n")
    base = await env.templates.get("parent")
    assert env.engine.builds[-1].splitlines()[0] == f"FROM {base.image}"


async def test_no_tenant_builds_from_the_servers_own_repositories(tmp_path: Path) -> None:
    engine = FakeEngine()
    config = Config(data_dir=tmp_path, image_allowlist="*")
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        quota = ImageQuota(0, engine, tstore, _no_snapshots)
        templates = Templates(
            config,
            engine,
            tstore,
            tmp_path / "spool",
            lambda t, n: _false(),
            quota=quota,
            settle_s=0,
        )
        try:
            env = Env(templates, engine, set())
            done = (await env.build("mine", "FROM busybox\n"))[-1]
            assert isinstance(done, TemplateRecord)
            engine.images[done.tag] = {}

            async def as_beta() -> None:
                tenancy.use_tenant("beta")
                for base in (done.tag, "sandboxd-snapshot:0123456789abcdef"):
                    engine.images[base] = {}
                    with pytest.raises(InvalidArgument) as info:
                        await env.build("steal", f"FROM {base}\n")
                    assert info.value.reason == "TEMPLATE_FROM_NOT_ALLOWED"
                await env.build("ok", "FROM busybox\n")  # the built-ins still resolve

            await asyncio.create_task(as_beta())
        finally:
            await templates.wait_cleanups()
            await templates.close()


async def _false() -> bool:
    return False


async def test_tenants_do_not_see_each_other(env: Env) -> None:
    await env.build("mine", "FROM busybox\n")

    async def as_beta() -> None:
        tenancy.use_tenant("beta")
        with pytest.raises(NotFound):
            await env.templates.get("mine")
        with pytest.raises(NotFound):
            await env.templates.delete("mine")
        with pytest.raises(InvalidArgument):
            await env.build("steal", "FROM mine\n")
        page, _ = await env.templates.list(0, "")
        assert [t.name for t in page] == ["base", "busybox", "python"]

    await asyncio.create_task(as_beta())


async def test_delete_rules(env: Env) -> None:
    await env.build("used", "FROM busybox\n")
    env.used.add((tenancy.current(), "used"))
    with pytest.raises(FailedPrecondition) as info:
        await env.templates.delete("used")
    assert info.value.reason == "TEMPLATE_IN_USE"
    env.used.clear()
    record = await env.templates.get("used")
    await env.templates.delete("used")
    assert record.tag not in env.engine.images
    with pytest.raises(FailedPrecondition) as info:
        await env.templates.delete("busybox")
    assert info.value.reason == "TEMPLATE_BUILTIN"


async def test_list_pages(env: Env) -> None:
    for n in ("a1", "c3", "z9"):
        await env.build(n, "FROM busybox\n")
    names, token = [], ""
    while True:
        page, token = await env.templates.list(2, token)
        names += [t.name for t in page]
        if not token:
            break
    assert names == ["a1", "base", "busybox", "c3", "python", "z9"]


async def test_a_build_cut_short_by_a_crash_is_failed_and_pruned(tmp_path: Path) -> None:
    engine = FakeEngine()
    config = Config(data_dir=tmp_path)
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        crashed = TemplateRecord(
            "half", TemplateState.BUILDING, datetime.now(UTC), tenant="t", build_id="b1"
        )
        await tstore.put(crashed)
        engine.images["leftover"] = {LABEL_BUILD: "b1"}
        engine.images["other"] = {LABEL_BUILD: "b2"}
        reopened = await TemplateStore(store.db).open()  # as at the next start
        got = await reopened.get("t", "half")
        assert got is not None and got.state is TemplateState.FAILED
        quota = ImageQuota(0, engine, reopened, _no_snapshots)
        templates = Templates(
            config, engine, reopened, tmp_path / "spool", _never_used, quota=quota
        )
        await templates.recover()
        assert "leftover" not in engine.images and "other" in engine.images


async def _never_used(tenant: str, name: str) -> bool:
    return False


async def _no_snapshots(tenant: str) -> list[str]:
    return []


async def test_a_page_token_answers_its_own_tenant_only(env: Env) -> None:
    for n in ("a1", "c3"):
        await env.build(n, "FROM busybox\n")
    _, token = await env.templates.list(1, "")
    assert token

    async def as_beta() -> None:
        tenancy.use_tenant("beta")
        with pytest.raises(InvalidArgument) as info:
            await env.templates.list(1, token)
        assert info.value.reason == "INVALID_PAGE_TOKEN"

    await asyncio.create_task(as_beta())


def _sparse_tar(tmp_path: Path) -> bytes:
    """A context whose one member declares 256 MiB of holes in a few KiB of tar (GNU tar)."""
    hole = tmp_path / "hole"
    with hole.open("wb") as f:
        f.truncate(256 * 1024**2)
    out = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(out), "-C", str(tmp_path), "hole"], check=True)
    return out.read_bytes()


def _fifo_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("pipe")
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["sparse", "gzip", "fifo"])
async def test_a_context_the_engine_would_unpack_past_its_size_is_refused(
    env: Env, tmp_path: Path, kind: str
) -> None:
    """The engine unpacks the context onto its own disk: a sparse member (holes written out
    as zeros), a compressed tar (inflated) or a special file are refused before it sees it."""
    data = {
        "sparse": lambda: _sparse_tar(tmp_path),
        "gzip": lambda: gzip.compress(_tar({"a": b"0" * 10_000})),
        "fifo": _fifo_tar,
    }[kind]()
    assert len(data) < 16384  # under the context cap
    with pytest.raises(InvalidArgument) as info:
        await env.build("ctx", "FROM busybox\nCOPY . /x\n", data)
    assert info.value.reason == "TEMPLATE_SPEC_INVALID"
    assert env.engine.builds == []


@pytest.mark.parametrize("kind", sorted(context_polyglots.MAGICS))
async def test_a_plain_tar_the_engine_would_read_as_compressed_is_refused(
    env: Env, kind: str
) -> None:
    """The engine picks a context's decompressor from its first bytes, so a tar whose header
    starts with a compression magic is inflated by the engine though tarfile reads it plain
    (a gzip one of 2 MiB was measured writing 2 GiB to the engine's disk)."""
    data = (
        context_polyglots.gzip_bomb(1 << 20)
        if kind == "gzip"
        else context_polyglots.named(context_polyglots.MAGICS[kind])
    )
    assert context_polyglots.members(data)  # a plain tar to Python
    with pytest.raises(InvalidArgument) as info:
        await env.build("ctx", "FROM busybox\nCOPY . /x\n", data)
    assert info.value.reason == "TEMPLATE_SPEC_INVALID"
    assert "compress" in info.value.message
    assert env.engine.builds == []


async def test_the_engine_is_sent_the_members_checked_and_nothing_between_them(env: Env) -> None:
    """tarfile and the engine's Go reader may cut one tar into different members (a global
    pax header's size applies to a later member in tarfile, to none in Go): the engine is
    sent the members as tarfile read them, each re-encoded by the server, so a member hidden
    from the checks (here a regular file; a device or a sparse file alike) never reaches it."""
    hidden = context_polyglots.plain_member("hidden.txt", b"never checked\n")
    data = context_polyglots.pax_smuggled(hidden)
    assert context_polyglots.members(data) == ["cover"]
    assert "hidden.txt" in context_polyglots.raw_names(data)  # what Go would read
    sent_contexts: list[bytes] = []
    build_image = env.engine.build_image

    def recording(context: Path, **kw: Any) -> AsyncIterator[str]:
        sent_contexts.append(context.read_bytes())
        return build_image(context, **kw)

    env.engine.build_image = recording  # type: ignore[method-assign]
    await env.build("ctx", "FROM busybox\nCOPY . /x\n", data)
    (sent,) = sent_contexts
    assert "hidden.txt" not in context_polyglots.raw_names(sent)
    dockerfile = context_polyglots.members(sent)[0]
    assert dockerfile.startswith(".sandboxd-dockerfile-")
    assert context_polyglots.members(sent) == [dockerfile, "cover"]
    assert context_polyglots.raw_names(sent) == [dockerfile, "cover"]
