"""A refusal reaches the caller as itself: the server's status of a client-streaming or bidi
call, never the transport error of a write the ended call no longer takes.

Each upload here is refused by the server while the client still has most of it to send, which
is when a write can fail on the half-closed stream. The loops make the race come up: before
the client kept the first status, about a third of the imports and some of the builds below came
back as `INTERNAL: Internal error from Core` (WriteFileStream and Interact did not show it in
these loops; they are kept as regressions). One test is the client's side of reply
sizes: it says how much its channel takes (`max_reply_bytes`).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import AsyncIterator

import pytest
from conftest import ServerProcess
from sandboxd_client import ResourceLimits, SandboxClient, errors

TRIES = 12
MiB = 1024 * 1024


def _big_member_tar(size: int) -> bytes:
    """A tar whose first member is larger than any file cap: refused at its header."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("big.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(b"\0" * size))
    return buf.getvalue()


async def _chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(server.address, timeout=120) as c:
        yield c


async def test_a_refused_import_is_its_own_error_every_time(client: SandboxClient) -> None:
    tar = _big_member_tar(48 * MiB)
    async with await client.create_session(allow=["true"]) as session:
        seen = []
        for _ in range(TRIES):
            with pytest.raises(errors.SandboxError) as caught:
                await session.import_archive(_chunks(tar))
            seen.append(f"{caught.value.code.name}/{caught.value.reason}")
        assert set(seen) == {"RESOURCE_EXHAUSTED/FILE_TOO_LARGE"}, seen


# ----- replies: the client says how much it takes ---------------------------------------------

SCRIPT = "head -c 9000000 /dev/zero; head -c 9000000 /dev/zero >&2; exit 3"


async def test_run_gets_what_the_clients_channel_takes(server: ServerProcess) -> None:
    """The client receives up to 64 MiB and says so (max_reply_bytes): more than a default
    reply's 4 MiB of the output, and the exit status. With its receive limit set back to
    gRPC's default, the same Run answers within 4 MiB, truncated, still with its status."""
    for receive, more_than_default in ((None, True), (4 * MiB, False)):
        options = [] if receive is None else [("grpc.max_receive_message_length", receive)]
        async with SandboxClient(server.address, timeout=120, options=options) as c:
            limits = ResourceLimits(output_bytes=16 * MiB)
            async with await c.create_session(allow=["sh", "head"], limits=limits) as session:
                got = await session.run(["sh", "-c", SCRIPT], max_output_bytes=16 * MiB)
        assert got.exit_code == 3 and got.truncated
        assert (len(got.stdout) + len(got.stderr) > 4 * MiB) == more_than_default


async def test_a_refused_stream_write_is_its_own_error_every_time(client: SandboxClient) -> None:
    data = b"\0" * (48 * MiB)
    limits = ResourceLimits(workspace_bytes=4 * MiB)
    async with await client.create_session(allow=["true"], limits=limits) as session:
        seen = set()
        for _ in range(TRIES):
            with pytest.raises(errors.SandboxError) as caught:
                await session.write_file_stream("big.bin", _chunks(data))
            seen.add(f"{caught.value.code.name}/{caught.value.reason}")
        assert seen == {"RESOURCE_EXHAUSTED/FILE_TOO_LARGE"}, seen


async def test_interact_that_ends_while_the_client_writes_ends_as_itself(
    client: SandboxClient,
) -> None:
    """A command that exits at once while the client keeps sending stdin: every try ends with
    its `exited` event (exit 3), never an error from a write the ended call refused."""
    from sandboxd_client import Exited

    chunk = b"\0" * (256 * 1024)
    async with await client.create_session(allow=["sh"]) as session:
        for _ in range(TRIES):
            async with session.interact(["sh", "-c", "exit 3"]) as proc:
                for _ in range(64):
                    await proc.send(chunk)
                events = [e async for e in proc]
            assert isinstance(events[-1], Exited) and events[-1].exit_code == 3


async def test_a_build_refused_at_its_spec_is_its_own_error_every_time(
    client: SandboxClient,
) -> None:
    """BuildTemplate (bidi) refused at its first message, a built-in name, while the client
    still streams a 48 MB context."""
    context = b"\0" * (48 * MiB)
    seen = set()
    for _ in range(TRIES):
        with pytest.raises(errors.SandboxError) as caught:
            async for _ in client.build_template("busybox", "FROM busybox\n", _chunks(context)):
                pass
        seen.add(f"{caught.value.code.name}/{caught.value.reason}")
    assert seen == {"FAILED_PRECONDITION/TEMPLATE_BUILTIN"}, seen
