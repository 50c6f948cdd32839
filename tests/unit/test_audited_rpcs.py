"""Every RPC is read-only or audited, and an audited one's record is made by the code that acts.

The generated descriptors are walked: each method of each service must be classified in
sandboxd.api.audited_rpcs, so a new RPC cannot be left out of the audit log by forgetting it.
Every audited method's record comes from a domain event (none is read off its messages at the
edge), and its producer is run here against the fakes with a recording observer: it must emit
that event, and the audit log's subscriber must turn it, inside the call's scope, into a record
of the classified kind that carries the call's method and trace id and is acknowledged before
the call may answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import io
import pkgutil
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import sandboxd.v1
from audit_world import HeldWriter, Recorder, Writer, audited_server, hello_session
from fakes import FakeEngine
from sandboxd import domain_events as de
from sandboxd.api import audited_rpcs
from sandboxd.audit import AuditEvent
from sandboxd.audit.subscriber import AuditSubscriber
from sandboxd.config import Config
from sandboxd.digest import hashing_threads
from sandboxd.models import ExecSpec
from sandboxd.processes import ProcessManager
from sandboxd.processes.record import BackgroundProcess
from sandboxd.pulls import Pulls
from sandboxd.server.transport import SERVICE_NAMES
from sandboxd.sessions import CreateSessionInput
from sandboxd.store import SessionStore
from sandboxd.sweeper import Sweeper
from sandboxd.templates.builds import Templates
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateStore
from sandboxd.v1 import filesystem_pb2, filesystem_pb2_grpc
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.service import Volumes
from sandboxd.volumes.store import VolumeStore
from session_stack import OWNER, session_stack


def _methods() -> set[str]:
    """Service/Method of every RPC in the generated modules (not only the served ones)."""
    found: set[str] = set()
    for info in pkgutil.iter_modules(sandboxd.v1.__path__):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"sandboxd.v1.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name in SERVICE_NAMES, f"{service.full_name} is not served"
            found |= {f"{service.name}/{m.name}" for m in service.methods}
    return found


def test_every_rpc_is_read_only_or_audited() -> None:
    methods = _methods()
    assert len(methods) > 50  # the walk found the API
    both = audited_rpcs.READ_ONLY & audited_rpcs.AUDITED.keys()
    assert not both, f"both read-only and audited: {sorted(both)}"
    unclassified = methods - audited_rpcs.READ_ONLY - audited_rpcs.AUDITED.keys()
    assert not unclassified, (
        f"classify these RPCs in sandboxd/api/audited_rpcs.py: {sorted(unclassified)}"
    )
    gone = (audited_rpcs.READ_ONLY | audited_rpcs.AUDITED.keys()) - methods
    assert not gone, f"classified, but no such RPC: {sorted(gone)}"


def test_every_event_named_is_a_domain_event() -> None:
    """No record is read off a call's messages: every audited RPC names its domain event."""
    for method, (source, _) in audited_rpcs.AUDITED.items():
        assert isinstance(getattr(de, source, None), type), f"{method}: {source}?"


# ----- the producers, on the fakes -----------------------------------------------------------


Scenario = Callable[[Path, Recorder], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(*methods: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        for m in methods:
            SCENARIOS[m] = fn
        return fn

    return register


@scenario("FilesystemService/WriteFileStream", "FilesystemService/Move")
async def _files(tmp_path: Path, observer: Recorder) -> None:
    from sandboxd.commands.sandbox import AgentFirstCommands
    from sandboxd.file_transfer import FileTransfer
    from sandboxd.helper_client import HelperClient
    from test_file_transfer_order import SESSION, _Engine

    engine = _Engine()
    commands = AgentFirstCommands(engine, engine, None)  # type: ignore[arg-type]
    transfer = FileTransfer(HelperClient(commands), 1.0, observer)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"

    async def release() -> None:
        while not engine.streams:
            await asyncio.sleep(0)
        engine.streams[0].released.set()

    releaser = asyncio.create_task(release())
    await transfer.write(SESSION, "keep.txt", 0o644, False, chunks())
    await releaser
    await transfer.move(SESSION, "keep.txt", "kept.txt", False)
    await transfer.close()


@scenario("FilesystemService/WriteFile", "FilesystemService/MakeDir", "FilesystemService/Remove")
async def _file_calls(tmp_path: Path, observer: Recorder) -> None:
    from sandboxd.commands.sandbox import AgentFirstCommands
    from sandboxd.files import Files
    from test_file_transfer_order import _Engine

    engine = _Engine()
    commands = AgentFirstCommands(engine, engine, None)  # type: ignore[arg-type]
    files = Files(commands, observer=observer)
    limits = SimpleNamespace(file_bytes=1 << 20, workspace_bytes=1 << 20)
    session: Any = SimpleNamespace(
        session_id="s1",
        tenant="alpha",
        container_id="c1",
        spec=SimpleNamespace(user="1000:1000", limits=limits),
    )

    async def release() -> None:
        while not engine.streams:
            await asyncio.sleep(0)
        engine.streams[0].released.set()

    releaser = asyncio.create_task(release())
    await files.write(session, "keep.txt", b"abc", 0, False)
    await releaser
    await files.make_dir(session, "folder", True)
    await files.remove(session, "keep.txt", False)


@scenario("ProcessService/SignalProcess")
async def _signal(tmp_path: Path, observer: Recorder) -> None:
    class Executor:
        detached = None
        sent: list[str] = []

        async def signal(self, session: object, token: str, name: str) -> None:
            self.sent.append(name)

    executor = Executor()
    pm = ProcessManager(executor, observer)  # type: ignore[arg-type]
    proc = BackgroundProcess("s1", "p1", ExecSpec(["sleep", "9"], "/workspace", {}, b"", 30.0, 1))
    pm._records_for("s1")["p1"] = proc
    session: Any = SimpleNamespace(session_id="s1", tenant="alpha")
    await pm.signal(session, "p1", "SIGTERM")
    assert executor.sent == ["SIGTERM"]


@scenario("ProcessService/SendProcessInput", "ProcessService/CloseProcessStdin")
async def _stdin(tmp_path: Path, observer: Recorder) -> None:
    class Command:
        stdin_closed = False

        async def write(self, data: bytes) -> None:
            pass

        def close_stdin(self) -> None:
            self.stdin_closed = True

    pm = ProcessManager(executor=None, observer=observer)  # type: ignore[arg-type]
    proc = BackgroundProcess("s1", "p1", ExecSpec(["cat"], "/workspace", {}, b"", 30.0, 1024))
    proc.command = Command()  # type: ignore[assignment]
    pm._records_for("s1")["p1"] = proc
    await pm.send_input("s1", "p1", b"hello")
    await pm.close_stdin("s1", "p1")


@contextlib.asynccontextmanager
async def _commands(tmp_path: Path, observer: Recorder) -> AsyncIterator[Any]:
    """A session of the fake engine with a file to `cat`, and a process manager over it."""
    from sandboxd.execution import Executor

    async with hello_session(tmp_path) as (st, session):
        executor = Executor(st.commands)
        spec = ExecSpec(["cat", "hello.txt"], "/workspace", {}, b"", 5.0, 1 << 20)
        yield SimpleNamespace(
            session=session, executor=executor, spec=spec, pm=ProcessManager(executor, observer)
        )


@scenario("ProcessService/Exec", "ProcessService/Run", "ProcessService/Interact")
async def _foreground(tmp_path: Path, observer: Recorder) -> None:
    from sandboxd import interactive
    from sandboxd.exec_spec import PtySize
    from sandboxd.processes import ProcessOrigin

    async def controls() -> AsyncIterator[interactive.Control]:
        yield interactive.CloseStdin()

    async with _commands(tmp_path, observer) as c:
        for origin in (ProcessOrigin.EXEC, ProcessOrigin.RUN):
            events = c.executor.stream(c.session, c.spec)
            async for _ in c.pm.track("s1", c.spec, origin, events):
                pass
        events = interactive.interact(
            c.executor, c.session, c.spec, PtySize(24, 80), controls(), 5.0, 30.0
        )
        async for _ in c.pm.track("s1", c.spec, ProcessOrigin.INTERACT, events, pty=True):
            pass


@scenario("ProcessService/StartProcess")
async def _background(tmp_path: Path, observer: Recorder) -> None:
    async with _commands(tmp_path, observer) as c:
        proc = await c.pm.start(c.session, c.spec, "r-1", request_id="retry-key")
        again = await c.pm.start(c.session, c.spec, "r-1", request_id="retry-key")
        assert again is proc  # the retry starts nothing: one CommandStarted
        assert proc.task is not None
        await proc.task


@scenario("AdminService/Sweep")
async def _sweep(tmp_path: Path, observer: Recorder) -> None:
    async with session_stack(tmp_path) as st:
        await Sweeper(st.sessions, st.engine, OWNER, st.snapshots, observer=observer).sweep()


@scenario("AdminService/PullImage")
async def _pull(tmp_path: Path, observer: Recorder) -> None:
    from test_pulls import DIGEST, REF, StubRegistry

    engine = FakeEngine()
    engine.remote[REF] = (DIGEST, (100, 200))
    config = Config(data_dir=tmp_path)
    pulls = Pulls(config, engine, registry=StubRegistry(), observer=observer)  # type: ignore[arg-type]
    async for _ in pulls.watch(REF):
        pass
    await pulls.close()


@scenario("TemplateService/BuildTemplate", "TemplateService/DeleteTemplate")
async def _templates(tmp_path: Path, observer: Recorder) -> None:
    engine = FakeEngine()

    async def in_use(tenant: str, name: str) -> bool:
        return False

    async def no_snapshots(tenant: str) -> list[str]:
        return []

    async def context() -> AsyncIterator[bytes]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w"):
            pass
        yield buf.getvalue()

    config = Config(data_dir=tmp_path)
    async with SessionStore(tmp_path / "sessions.db") as store:
        tstore = await TemplateStore(store.db).open()
        quota = ImageQuota(0, engine, tstore, no_snapshots)
        templates = Templates(
            config,
            engine,
            tstore,
            tmp_path / "spool",
            in_use,
            quota=quota,
            settle_s=0,
            observer=observer,
        )
        async for _ in templates.build("web", "FROM busybox\n", context()):
            pass
        await templates.delete("web")
        await templates.wait_cleanups()
        await templates.close()


@scenario("SessionService/PublishPort", "SessionService/UnpublishPort")
async def _ports(tmp_path: Path, observer: Recorder) -> None:
    from preview_world import LoopbackDialer, preview_parts

    async with preview_parts(tmp_path, LoopbackDialer(), observer) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await world.previews.publish("s1", 8080, None, False)
        await world.previews.unpublish("s1", 8080)


@scenario("VolumeService/ImportVolume", "VolumeService/ExportVolume")
async def _volumes(tmp_path: Path, observer: Recorder) -> None:
    from test_volumes_domain import FakeDisks, _settings

    class Porter:
        async def export(self, disk: str, size_bytes: int) -> AsyncIterator[bytes]:
            yield b"tar"

        async def import_(
            self, disk: str, size_bytes: int, replace: bool, chunks: AsyncIterator[bytes]
        ) -> None:
            async for _ in chunks:
                pass

        async def sweep(self) -> int:
            return 0

    async def data() -> AsyncIterator[bytes]:
        yield b"tar bytes"

    disks = FakeDisks()
    async with SessionStore(tmp_path / "sessions.db") as store:
        vstore = await VolumeStore(store.db).open()
        claims = VolumeClaims(vstore, store, disks)
        settings = _settings(tenant_max_volumes=5, tenant_max_bytes=1 << 34)
        volumes = Volumes(settings, vstore, claims, disks, OWNER, Porter(), observer)  # type: ignore[arg-type]
        await volumes.create("data", 1 << 30, {})
        await volumes.import_("data", True, data())
        async for _ in volumes.export("data"):
            pass


@scenario(
    "SessionService/CreateSession",
    "SessionService/RenewLease",
    "SessionService/UpdateNetworkPolicy",
    "SessionService/SuspendSession",
    "SessionService/ResumeSession",
    "SessionService/DeleteSession",
)
async def _session_lifecycle(tmp_path: Path, observer: Recorder) -> None:
    from sandboxd.models import NetworkPolicy

    async with session_stack(tmp_path, observer=observer) as st:
        await st.sessions.create(CreateSessionInput(session_id="s1"))
        await st.sessions.renew("s1", 60.0)
        await st.sessions.update_network_policy("s1", NetworkPolicy())
        await st.sessions.suspend("s1")
        await st.sessions.resume("s1", None)
        await st.sessions.delete("s1")
    actions = [e.action for e in observer.events if isinstance(e, de.SessionActed)]
    assert actions == [
        "create",
        "renew",
        "update_network_policy",
        "suspend",
        "resume",
        "delete",
    ]


@scenario("SnapshotService/CreateSnapshot", "SnapshotService/DeleteSnapshot")
async def _snapshots(tmp_path: Path, observer: Recorder) -> None:
    async with session_stack(tmp_path, observer=observer) as st:
        await st.sessions.create(CreateSessionInput(session_id="s1"))
        snap = await st.snapshots.create("s1", {}, "")
        await st.snapshots.delete(snap.snapshot_id)


@scenario("VolumeService/CreateVolume", "VolumeService/DeleteVolume")
async def _volume_lifecycle(tmp_path: Path, observer: Recorder) -> None:
    from test_volumes_domain import FakeDisks, _settings

    disks = FakeDisks()
    async with SessionStore(tmp_path / "sessions.db") as store:
        vstore = await VolumeStore(store.db).open()
        claims = VolumeClaims(vstore, store, disks)
        settings = _settings(tenant_max_volumes=5, tenant_max_bytes=1 << 34)
        volumes = Volumes(settings, vstore, claims, disks, OWNER, None, observer)  # type: ignore[arg-type]
        await volumes.create("data", 1 << 30, {})
        assert await volumes.delete("data")


@scenario("SnapshotService/ImportArchive", "SnapshotService/ExportArchive")
async def _archives(tmp_path: Path, observer: Recorder) -> None:
    from sandboxd.archive.calls import ArchiveCalls
    from sandboxd.archive.transfer import ImportResult

    class Archive:
        async def export(self, session: object, path: str) -> AsyncIterator[bytes]:
            yield b"tar"

        async def import_(
            self, session: object, path: str, replace: bool, chunks: AsyncIterator[bytes]
        ) -> ImportResult:
            async for _ in chunks:
                pass
            return ImportResult(files=1, bytes=3)

    async def data() -> AsyncIterator[bytes]:
        yield b"tar bytes"

    session: Any = SimpleNamespace(session_id="s1", tenant="alpha")
    async with hashing_threads(1) as pool:
        calls = ArchiveCalls(Archive(), pool, observer)  # type: ignore[arg-type]
        await calls.import_(session, "in", False, data())
        async for _ in calls.export(session, "."):
            pass


def test_every_domain_audited_rpc_has_its_producer_run_here() -> None:
    assert set(SCENARIOS) == set(audited_rpcs.AUDITED)


@pytest.mark.parametrize("method", sorted(SCENARIOS))
async def test_the_producer_emits_and_the_audit_records_it_in_the_call(
    method: str, tmp_path: Path
) -> None:
    source, kind = audited_rpcs.AUDITED[method]
    observer = Recorder()

    await asyncio.create_task(SCENARIOS[method](tmp_path, observer))
    emitted = [e for e in observer.events if type(e).__name__ == source]
    assert emitted, f"{method}: no {source} was emitted ({observer.events})"

    writer = Writer()
    subscriber = AuditSubscriber(writer)  # type: ignore[arg-type]

    async def in_the_call() -> None:
        scope = de.CallScope(method, "ab" * 16)
        de.CURRENT_SCOPE.set(scope)
        for event in emitted:
            subscriber(event)
        assert not writer.acknowledged  # deferred: the call waits for it before answering
        await scope.settle()
        scope.close()

    await asyncio.create_task(in_the_call())
    assert len(writer.acknowledged) == len(emitted) and not writer.queued
    assert kind in {r.kind for r in writer.acknowledged}, method
    for record, event in zip(writer.acknowledged, emitted, strict=True):
        assert record.attributes["method"] == method
        assert record.trace_id == "ab" * 16
        assert record.tenant == event.tenant


async def test_an_event_after_its_call_answered_is_queued_not_deferred() -> None:
    writer = Writer()
    subscriber = AuditSubscriber(writer)  # type: ignore[arg-type]
    event = de.FileMoved("default", "s1", "a", "b", False, 3)

    async def late() -> None:
        scope = de.CallScope("FilesystemService/Move")
        de.CURRENT_SCOPE.set(scope)
        scope.close()
        subscriber(event)

    await asyncio.create_task(late())
    assert [e.kind for e in writer.queued] == ["file_write"] and not writer.acknowledged
    assert "method" not in writer.queued[0].attributes


async def test_a_failed_acknowledgement_fails_the_settle() -> None:
    from sandboxd.errors import Unavailable

    class Broken(Writer):
        async def record(self, event: AuditEvent) -> AuditEvent:
            raise Unavailable("the audit log could not be written")

    subscriber = AuditSubscriber(Broken())  # type: ignore[arg-type]

    async def call() -> None:
        scope = de.CallScope("FilesystemService/Move")
        de.CURRENT_SCOPE.set(scope)
        subscriber(de.FileMoved("default", "s1", "a", "b", False, 3))
        with pytest.raises(Unavailable):
            await scope.settle()

    await asyncio.create_task(call())


def test_events_are_frozen() -> None:
    for name in de.__all__ if hasattr(de, "__all__") else dir(de):
        value = getattr(de, name)
        if isinstance(value, type) and dataclasses.is_dataclass(value) and name != "CallScope":
            assert value.__dataclass_params__.frozen, name  # type: ignore[attr-defined]


# ----- the edge, over a real gRPC server --------------------------------------------------------


class _Mover(filesystem_pb2_grpc.FilesystemServiceServicer):
    """A Move that does what the domain does: emits FileMoved into the observer."""

    def __init__(self, observer: de.Observer) -> None:
        self._observer = observer

    async def Move(  # noqa: N802
        self, request: filesystem_pb2.MoveRequest, context: object
    ) -> filesystem_pb2.MoveResponse:
        self._observer.emit(
            de.FileMoved(
                "default",
                request.session_id,
                request.source_path,
                request.destination_path,
                False,
                1,
            )
        )
        return filesystem_pb2.MoveResponse()


@contextlib.asynccontextmanager
async def _served(writer: HeldWriter) -> AsyncIterator[filesystem_pb2_grpc.FilesystemServiceStub]:
    observer = de.FanOut([AuditSubscriber(writer)])  # type: ignore[arg-type]
    add = filesystem_pb2_grpc.add_FilesystemServiceServicer_to_server
    stub = filesystem_pb2_grpc.FilesystemServiceStub
    async with hashing_threads(1), audited_server(observer, add, _Mover(observer), stub) as s:
        yield s


async def test_the_edge_answers_only_once_the_events_record_is_acknowledged() -> None:
    writer = HeldWriter()
    async with _served(writer) as stub:
        traced = (("traceparent", f"00-{'ab' * 16}-00f067aa0ba902b7-01"),)
        call = asyncio.ensure_future(
            stub.Move(
                filesystem_pb2.MoveRequest(session_id="s1", source_path="a", destination_path="b"),
                metadata=traced,
            )
        )
        await asyncio.sleep(0.3)
        assert not call.done()  # the record is not acknowledged: no answer yet
        writer.release.set()
        await call
    (record,) = writer.acknowledged
    assert record.kind == "file_write" and record.attributes["method"] == "FilesystemService/Move"
    assert record.trace_id == "ab" * 16


async def test_the_edge_fails_a_call_whose_record_the_log_cannot_take() -> None:
    writer = HeldWriter()
    writer.fail = True
    writer.release.set()
    async with _served(writer) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Move(
                filesystem_pb2.MoveRequest(session_id="s1", source_path="a", destination_path="b")
            )
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


# ----- the records the edge used to read off the messages, unchanged ----------------------------


@pytest.mark.parametrize(
    ("event", "kind", "session_id", "attributes"),
    [
        (
            de.SessionActed("alpha", "s1", "create", image="busybox", from_snapshot_id="x"),
            "lifecycle",
            "s1",
            {"action": "create", "image": "busybox"},
        ),
        (de.SessionActed("alpha", "s1", "renew"), "lifecycle", "s1", {"action": "renew"}),
        (
            de.SessionActed("alpha", "s1", "delete", existed=False),
            "lifecycle",
            "s1",
            {"action": "delete"},
        ),
        (
            de.SnapshotTaken("alpha", "s1", "snap-1", 10, "ab", ""),
            "snapshot",
            "s1",
            {"action": "create", "snapshot_id": "snap-1", "size_bytes": "10", "sha256": "ab"},
        ),
        (
            de.SnapshotDeleted("alpha", "snap-1"),
            "lifecycle",
            "",
            {"action": "delete_snapshot", "snapshot_id": "snap-1"},
        ),
        (
            de.VolumeCreated("alpha", "data", 1),
            "lifecycle",
            "",
            {"action": "create_volume", "volume_id": "data"},
        ),
        (
            de.VolumeDeleted("alpha", "data", True),
            "lifecycle",
            "",
            {"action": "delete_volume", "volume_id": "data"},
        ),
        (
            de.ArchiveExported("alpha", "s1", ".", 3, "cd"),
            "archive_export",
            "s1",
            {"path": ".", "tar_bytes": "3", "sha256": "cd"},
        ),
        (
            de.ArchiveImported("alpha", "s1", "in", True, 1, 5, 9, "ef"),
            "archive_import",
            "s1",
            {
                "path": "in",
                "replace": "true",
                "files": "1",
                "bytes_written": "5",
                "tar_bytes": "9",
                "sha256": "ef",
            },
        ),
    ],
)
async def test_the_moved_records_keep_their_attributes(
    event: de.DomainEvent, kind: str, session_id: str, attributes: dict[str, str]
) -> None:
    writer = Writer()
    subscriber = AuditSubscriber(writer)  # type: ignore[arg-type]

    async def call() -> None:
        scope = de.CallScope("Some/Call", "ab" * 16)
        de.CURRENT_SCOPE.set(scope)
        subscriber(event)
        await scope.settle()

    await asyncio.create_task(call())
    (record,) = writer.acknowledged
    assert (record.kind, record.session_id) == (kind, session_id)
    assert dict(record.attributes) == {**attributes, "method": "Some/Call"}


async def test_the_servers_own_snapshot_is_not_a_callers_record() -> None:
    """A checkpoint (taken by the server, in no call) is not recorded as a CreateSnapshot."""
    writer = Writer()
    AuditSubscriber(writer)(de.SnapshotTaken("alpha", "s1", "snap-1", 10, "ab", ""))  # type: ignore[arg-type]
    assert not writer.acknowledged and not writer.queued
