"""The Python client (clients/python) against a real server: every RPC through its wrapper."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import secrets
import tarfile
from collections.abc import AsyncIterator

import grpc
import pytest
from conftest import ServerProcess
from sandboxd.v1 import admin_pb2, admin_pb2_grpc
from sandboxd_client import (
    Exited,
    FileInfo,
    Keepalive,
    NetworkPolicy,
    Output,
    ProcessInfo,
    SandboxClient,
    ServerInfo,
    SessionInfo,
    SnapshotInfo,
    Started,
    errors,
)


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(server.address, timeout=60) as c:
        yield c


def _is_plain(value: object) -> bool:
    """Results are the client's dataclasses (or builtins), never protobuf messages."""
    return "google.protobuf" not in type(value).__module__ and not hasattr(value, "DESCRIPTOR")


async def test_session_lifecycle_exec_and_files(client: SandboxClient) -> None:
    label = {"suite": "client-" + secrets.token_hex(4)}
    async with await client.create_session(
        allow=["sh", "echo", "cat"], files={"hello.txt": b"hello\n"}, labels=label
    ) as session:
        assert session.state == "RUNNING" and isinstance(session.info, SessionInfo)
        assert set(session.info.shell.allow) == {"sh", "echo", "cat"}

        result = await session.run(["cat", "hello.txt"])
        assert result.ok and result.stdout == b"hello\n" and result.exit_code == 0

        events = [e async for e in session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])]
        assert isinstance(events[0], Started) and events[0].process_id
        assert isinstance(events[-1], Exited) and events[-1].exit_code == 3
        outputs = [e for e in events if isinstance(e, Output)]
        assert b"".join(e.data for e in outputs if e.stream == "stdout") == b"out\n"
        assert b"".join(e.data for e in outputs if e.stream == "stderr") == b"err\n"
        assert not any(isinstance(e, Keepalive) for e in events)

        info = await session.write_file("notes/todo.txt", b"ship it\n", make_parents=True)
        assert isinstance(info, FileInfo) and info.type == "FILE"
        assert await session.read_file("notes/todo.txt") == b"ship it\n"
        assert (await session.stat("notes/todo.txt")).size == 8
        made = await session.make_dir("a/b", parents=True)
        assert made.type == "DIRECTORY"
        entries = [e async for e in session.list_dir("", depth=3)]
        assert all(isinstance(e, FileInfo) for e in entries)
        assert {"hello.txt", "notes", "notes/todo.txt", "a", "a/b"} <= {e.path for e in entries}
        await session.remove("a", recursive=True)
        with pytest.raises(errors.FileNotFound) as exc:
            await session.stat("a")
        assert exc.value.reason == errors.Reason.FILE_NOT_FOUND and not exc.value.retryable

        listed = [s.id async for s in client.list_sessions(label)]
        assert listed == [session.id]

        before = session.lease_expires_at
        assert before is not None
        await asyncio.sleep(0.01)
        await session.renew(3600)
        assert session.lease_expires_at is not None and session.lease_expires_at > before
        assert (await client.get_session(session.id)).id == session.id
        await session.refresh()
        assert session.state == "RUNNING"

    # __aexit__ deleted it
    with pytest.raises(errors.SessionNotFound) as gone:
        await client.get_session(session.id)
    assert gone.value.reason == "SESSION_NOT_FOUND" and gone.value.code == grpc.StatusCode.NOT_FOUND
    await session.delete()  # idempotent


async def test_errors_are_typed_from_error_info(client: SandboxClient) -> None:
    async with await client.create_session(allow=["echo"]) as session:
        with pytest.raises(errors.CommandNotAllowed) as denied:
            await session.run(["rm", "-rf", "/workspace"])
        assert denied.value.reason == "COMMAND_NOT_ALLOWED"
        assert isinstance(denied.value, errors.PermissionDenied)
        assert "COMMAND_NOT_ALLOWED" in str(denied.value)

        # a server stream fails when read, and raises the same typed error
        with pytest.raises(errors.CommandNotAllowed):
            async for _ in session.exec(["rm", "x"]):
                pass

        with pytest.raises(errors.PathError) as outside:
            await session.read_file("../etc/passwd")
        assert outside.value.reason.startswith("PATH_")

    with pytest.raises(errors.InvalidArgument) as bad:
        await client.create_session(allow=["echo"], user="0:0")
    assert bad.value.reason == "INVALID_USER"


async def test_breaking_out_of_exec_kills_the_command(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        async for event in session.exec(["sh", "-c", "echo ready; sleep 60"]):
            if isinstance(event, Output):
                break  # cancels the call; the server kills the process group
        for _ in range(50):
            ps = await session.run(["sh", "-c", "ps -o args | grep -c '[s]leep 60' || true"])
            if ps.stdout.strip() == b"0":
                break
            await asyncio.sleep(0.1)
        assert ps.stdout.strip() == b"0"


async def test_background_process_attach_replay_and_signal(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        proc = await session.start_process(
            ["sh", "-c", "echo one; echo two; sleep 60"], process_id="bg-1"
        )
        assert isinstance(proc, ProcessInfo) and proc.process_id == "bg-1"
        assert proc.state == "RUNNING"
        with pytest.raises(errors.ProcessAlreadyExists):
            await session.start_process(["sleep", "1"], process_id="bg-1")

        seen = b""
        async for event in session.attach("bg-1"):
            if isinstance(event, Output):
                seen += event.data
            if seen == b"one\ntwo\n":
                break
        assert seen == b"one\ntwo\n"
        # a second attach from an offset replays only what follows it
        async for event in session.attach("bg-1", stdout_offset=4):
            assert isinstance(event, Output | Started)
            if isinstance(event, Output):
                assert event.offset == 4 and event.data.startswith(b"two")
                break

        assert [p.process_id async for p in session.processes()] == ["bg-1"]
        await session.signal_process("bg-1", "SIGKILL")
        last = None
        async for event in session.attach("bg-1"):
            last = event
        assert isinstance(last, Exited) and last.signal == "SIGKILL"
        (done,) = [p async for p in session.processes()]
        assert done.state == "EXITED" and done.exited is not None
        with pytest.raises(errors.ProcessNotFound):
            await session.signal_process("nope", "SIGTERM")


async def test_interact_with_a_pty(client: SandboxClient) -> None:
    async with (
        await client.create_session(allow_all=True) as session,
        session.interact(["sh"], pty=(24, 80)) as proc,
    ):
        text = b""
        exited = None
        sent = False
        async for event in proc:
            if isinstance(event, Output):
                text += event.data
                if not sent and b"$ " in text:  # the shell is up: resize, then ask
                    sent = True
                    await proc.resize(30, 100)
                    await proc.send(b"stty size; exit 7\n")
            elif isinstance(event, Exited):
                exited = event
        assert b"30 100" in text
        assert exited is not None and exited.exit_code == 7


async def test_interact_stdin_close(client: SandboxClient) -> None:
    async with (
        await client.create_session(allow_all=True) as session,
        session.interact(["cat"]) as proc,
    ):
        await proc.send(b"piped\n")
        await proc.close_stdin()
        events = [e async for e in proc]
        assert b"".join(e.data for e in events if isinstance(e, Output)) == b"piped\n"
        assert isinstance(events[-1], Exited) and events[-1].exit_code == 0


async def test_snapshots_and_a_session_forked_from_one(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        await session.write_file("state.txt", b"v1")
        snap = await session.snapshot(labels={"step": "1"})
        assert (
            isinstance(snap, SnapshotInfo) and snap.kind == "TAR" and snap.labels == {"step": "1"}
        )
        assert (await client.get_snapshot(snap.snapshot_id)).sha256 == snap.sha256
        assert [s.snapshot_id async for s in session.snapshots()] == [snap.snapshot_id]
        tar_bytes = b"".join([c async for c in client.download_snapshot(snap.snapshot_id)])
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            assert any(m.name.endswith("state.txt") for m in tar.getmembers())

        async with await client.create_session(
            allow_all=True, from_snapshot_id=snap.snapshot_id
        ) as fork:
            assert await fork.read_file("state.txt") == b"v1"

        await client.delete_snapshot(snap.snapshot_id)
        with pytest.raises(errors.SnapshotNotFound):
            await client.get_snapshot(snap.snapshot_id)


async def test_suspend_resume_and_network_calls(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        await session.write_file("kept.txt", b"kept")
        await session.suspend()
        assert session.state == "SUSPENDED"
        assert (await client.get_session(session.id)).state == "SUSPENDED"
        await session.resume(expected_fingerprint=session.info.fingerprint)
        assert session.state == "RUNNING"
        assert await session.read_file("kept.txt") == b"kept"
        assert [e async for e in session.egress_events()] == []
        same = dataclasses.replace(session.info.network)
        assert (await session.update_network_policy(same)).info.network.mode == "DENY"
        with pytest.raises(errors.FailedPrecondition) as fixed:
            await session.update_network_policy(
                NetworkPolicy("ALLOWLIST", ("example.com",), (443,))
            )
        assert fixed.value.reason in ("NETWORK_MODE_FIXED", "EGRESS_UNAVAILABLE")


async def test_server_info_and_sweep(client: SandboxClient) -> None:
    info = await client.server_info()
    assert isinstance(info, ServerInfo) and _is_plain(info) and _is_plain(info.security_defaults)
    assert info.api_version == "v1" and info.version
    assert {"pty", "background_processes", "snapshots"} <= set(info.features)
    # gvisor too where `make gvisor` registered runsc with the engine.
    assert info.isolation_tiers in (("RUNC",), ("RUNC", "GVISOR"))
    assert info.security_defaults.user == "1900000000-1900065535"  # each session its own uid
    swept = await client.sweep()
    assert swept.expired_sessions >= 0


async def test_a_deadline_is_kept_and_typed(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        with pytest.raises(errors.DeadlineExceeded):
            await session.run(["sleep", "5"], deadline=0.5)
        started = asyncio.get_running_loop().time()
        with pytest.raises(errors.DeadlineExceeded):
            async for _ in session.exec(["sleep", "5"], deadline=0.5):
                pass
        assert asyncio.get_running_loop().time() - started < 3


async def test_cancelling_the_task_cancels_the_call(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        task = asyncio.create_task(session.run(["sleep", "30"]))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            ps = await session.run(["sh", "-c", "ps -o args | grep -c '[s]leep 30' || true"])
            if ps.stdout.strip() == b"0":
                break
            await asyncio.sleep(0.1)
        assert ps.stdout.strip() == b"0"


async def test_nothing_listening_is_unreachable() -> None:
    async with SandboxClient("127.0.0.1:1", timeout=5) as c:
        with pytest.raises(errors.ServerUnreachable) as exc:
            await c.server_info()
    assert exc.value.reason == "UNAVAILABLE" and "127.0.0.1:1" in exc.value.message


async def test_client_states() -> None:
    c = SandboxClient("127.0.0.1:1")
    with pytest.raises(RuntimeError, match="unopened"):
        _ = c.channel
    async with c:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        c.open()


async def test_bearer_token_is_sent_on_every_call() -> None:
    """A local stand-in server records the metadata the client sends."""
    seen: list[str | bytes] = []

    class Admin(admin_pb2_grpc.AdminServiceServicer):
        async def GetServerInfo(  # noqa: N802  (the RPC's name)
            self, request: admin_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
        ) -> admin_pb2.GetServerInfoResponse:
            seen.extend(v for k, v in context.invocation_metadata() or () if k == "authorization")
            return admin_pb2.GetServerInfoResponse(version="stand-in")

    srv = grpc.aio.server()
    admin_pb2_grpc.add_AdminServiceServicer_to_server(Admin(), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        async with SandboxClient(f"127.0.0.1:{port}", token="s3cret") as c:
            assert (await c.server_info()).version == "stand-in"
            assert (await c.server_info()).version == "stand-in"
    finally:
        await srv.stop(None)
    assert seen == ["Bearer s3cret", "Bearer s3cret"]


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def test_archive_round_trip_and_refusal(client: SandboxClient) -> None:
    async with await client.create_session(allow_all=True) as session:
        done = await session.import_archive(_chunks(_tar({"d/x.txt": b"x" * 5000})), "in")
        assert (done.files, done.bytes) >= (1, 5000)
        assert await session.read_file("in/d/x.txt") == b"x" * 5000

        data = b"".join([c async for c in session.export_archive("in")])
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            files = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
            member = tar.extractfile(files["d/x.txt"])
            assert member is not None and member.read() == b"x" * 5000

        with pytest.raises(errors.ArchiveRejected) as rejected:
            await session.import_archive(_chunks(_tar({"../escape.txt": b"no"})))
        assert rejected.value.reason == "ARCHIVE_PATH_TRAVERSAL"
        with pytest.raises(errors.SandboxError) as missing:
            async for _ in session.export_archive("no-such-folder"):
                pass
        assert missing.value.reason in ("FILE_NOT_FOUND", "NOT_A_DIRECTORY")


async def test_archives_travel_zstd_by_default_and_plain_when_asked(
    client: SandboxClient,
) -> None:
    from sandboxd_client._gen.sandboxd.v1 import snapshot_pb2

    async with await client.create_session(allow_all=True) as session:
        asked: list[int] = []
        stubs = session._stubs.snapshots
        export, import_ = stubs.ExportArchive, stubs.ImportArchive

        def spy_export(req: snapshot_pb2.ExportArchiveRequest, **kw: object) -> object:
            asked.append(req.compression)
            return export(req, **kw)

        def spy_import(requests: AsyncIterator[object], **kw: object) -> object:
            async def seen() -> AsyncIterator[object]:
                async for req in requests:
                    if req.HasField("header"):  # type: ignore[attr-defined]
                        asked.append(req.header.compression)  # type: ignore[attr-defined]
                    yield req

            return import_(seen(), **kw)

        stubs.ExportArchive, stubs.ImportArchive = spy_export, spy_import
        try:
            content = b"print('hello')\n" * 20_000
            for mode in ("auto", "none"):
                done = await session.import_archive(
                    _chunks(_tar({f"{mode}/src.py": content}), 64 * 1024),
                    replace=True,
                    compression=mode,
                )
                assert done.bytes == len(content)
                data = b"".join([c async for c in session.export_archive(compression=mode)])
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    got = tar.extractfile(f"./{mode}/src.py")
                    assert got is not None and got.read() == content
        finally:
            stubs.ExportArchive, stubs.ImportArchive = export, import_
        zstd, plain = snapshot_pb2.ARCHIVE_COMPRESSION_ZSTD, 0
        assert asked == [zstd, zstd, plain, plain]


async def test_isolation_is_asked_and_echoed(client: SandboxClient) -> None:
    async with await client.create_session(allow=["echo"], isolation="runc") as session:
        assert session.info.isolation == "RUNC"
    info = await client.server_info()
    if "GVISOR" not in info.isolation_tiers:
        with pytest.raises(errors.FailedPrecondition) as refused:
            await client.create_session(allow=["echo"], isolation="gvisor")
        assert refused.value.reason == "ISOLATION_UNAVAILABLE"
        return
    async with await client.create_session(allow=["echo"], isolation="gvisor") as session:
        assert session.info.isolation == "GVISOR"
        assert (await session.run(["echo", "hi"])).stdout == b"hi\n"


async def test_the_python_template(client: SandboxClient) -> None:
    async with await client.create_session(allow=["python3"], template="python") as session:
        assert session.info.template == "python"
        assert (await session.run(["python3", "-c", "print(6 * 7)"])).stdout == b"42\n"
