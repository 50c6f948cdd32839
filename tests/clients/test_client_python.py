"""The Python client (clients/python) against a real server: sessions, exec, files, errors."""

from __future__ import annotations

import asyncio
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
    Keepalive,
    Output,
    SandboxClient,
    Started,
    errors,
)


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(server.address, timeout=60) as c:
        yield c


async def test_session_lifecycle_exec_and_files(client: SandboxClient) -> None:
    label = {"suite": "client-" + secrets.token_hex(4)}
    async with await client.create_session(
        allow=["sh", "echo", "cat"], files={"hello.txt": b"hello\n"}, labels=label
    ) as session:
        assert session.state == "RUNNING"

        result = await session.run(["cat", "hello.txt"])
        assert result.ok and result.stdout == b"hello\n" and result.exit_code == 0

        events = [e async for e in session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])]
        assert isinstance(events[0], Started) and events[0].process_id
        assert isinstance(events[-1], Exited) and events[-1].exit_code == 3
        outputs = [e for e in events if isinstance(e, Output)]
        assert b"".join(e.data for e in outputs if e.stream == "stdout") == b"out\n"
        assert b"".join(e.data for e in outputs if e.stream == "stderr") == b"err\n"
        assert not any(isinstance(e, Keepalive) for e in events)

        await session.write_file("notes/todo.txt", b"ship it\n", make_parents=True)
        assert await session.read_file("notes/todo.txt") == b"ship it\n"
        assert (await session.stat("notes/todo.txt")).size == 8
        await session.make_dir("a/b", parents=True)
        names = sorted(e.path for e in await session.list_dir("", depth=3))
        assert {"hello.txt", "notes", "notes/todo.txt", "a", "a/b"} <= set(names)
        await session.remove("a", recursive=True)
        with pytest.raises(errors.NotFound) as exc:
            await session.stat("a")
        assert exc.value.reason == "FILE_NOT_FOUND"

        listed = [s.id async for s in client.list_sessions(label)]
        assert listed == [session.id]

        before = session.lease_expires_at
        await asyncio.sleep(0.01)
        await session.renew(3600)
        assert session.lease_expires_at > before
        assert (await client.get_session(session.id)).id == session.id

    # __aexit__ deleted it
    with pytest.raises(errors.SessionNotFound) as gone:
        await client.get_session(session.id)
    assert gone.value.reason == "SESSION_NOT_FOUND" and gone.value.code == grpc.StatusCode.NOT_FOUND


async def test_errors_are_typed_from_error_info(client: SandboxClient) -> None:
    async with await client.create_session(allow=["echo"]) as session:
        with pytest.raises(errors.PermissionDenied) as denied:
            await session.run(["rm", "-rf", "/workspace"])
        assert denied.value.reason == "COMMAND_NOT_ALLOWED"
        assert "COMMAND_NOT_ALLOWED" in str(denied.value)

        # a server stream fails when read, and raises the same typed error
        with pytest.raises(errors.PermissionDenied):
            async for _ in session.exec(["rm", "x"]):
                pass

        with pytest.raises(errors.InvalidArgument) as outside:
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


async def test_server_info(client: SandboxClient) -> None:
    info = await client.server_info()
    assert info.version and info.security_defaults.user


async def test_nothing_listening_is_unavailable() -> None:
    async with SandboxClient("127.0.0.1:1", timeout=5) as c:
        with pytest.raises(errors.Unavailable) as exc:
            await c.server_info()
    assert exc.value.reason == "UNAVAILABLE"


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
    finally:
        await srv.stop(None)
    assert seen == ["Bearer s3cret"]


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

        with pytest.raises(errors.InvalidArgument):
            await session.import_archive(_chunks(_tar({"../escape.txt": b"no"})))
        with pytest.raises(errors.SandboxError) as missing:
            async for _ in session.export_archive("no-such-folder"):
                pass
        assert missing.value.reason in ("FILE_NOT_FOUND", "NOT_A_DIRECTORY")
