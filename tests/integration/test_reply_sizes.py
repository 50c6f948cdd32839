"""No reply is larger than a client with gRPC's DEFAULT options accepts (4 MiB, every language).

Each test talks over a channel made with no options at all (no max_receive_message_length), as
grpcurl and every language's client do by default, to a real server whose own message limit
is 17 MiB, with the session's caps raised within the server's maxima. Before the replies were
bounded by the caller's limit, each of these calls failed in the client with `RESOURCE_EXHAUSTED:
received message larger than max` (the Run losing its exit status); now each answers within
4 MiB: output cut with `truncated`, a file refused naming ReadFileStream, a page cut short. A
request's `max_reply_bytes` lets a client that raised its limit have more.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from conftest import ServerProcess, SessionFactory, Stubs, error_info, run
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
)

pytestmark = pytest.mark.usefixtures("guard")

MiB = 1024 * 1024
DEFAULT_LIMIT = 4 * MiB  # gRPC's default max_receive_message_length
BIG = common_pb2.ResourceLimits(
    output_bytes=16 * MiB, file_bytes=16 * MiB, workspace_bytes=256 * MiB
)
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def plain(server: ServerProcess) -> Iterator[grpc.Channel]:
    """A channel with gRPC's defaults: it refuses any message over 4 MiB."""
    channel = grpc.insecure_channel(server.address)
    yield channel
    channel.close()


def _refused_by_reason(err: grpc.RpcError) -> str:
    assert err.code() == RE, f"{err.code()} {err.details()}"  # type: ignore[attr-defined]
    return error_info(err).reason  # a status the server sent, not the client's own refusal


def test_run_with_9_mb_on_each_stream_keeps_its_exit_status(
    plain: grpc.Channel, new_session: SessionFactory
) -> None:
    s = new_session(limits=BIG)
    script = "head -c 9000000 /dev/zero; head -c 9000000 /dev/zero >&2; exit 3"
    got = process_pb2_grpc.ProcessServiceStub(plain).Run(
        process_pb2.RunRequest(
            session_id=s.session_id, argv=["sh", "-c", script], max_output_bytes=16 * MiB
        ),
        timeout=120,
    )
    assert got.exit_code == 3
    assert got.truncated
    assert got.ByteSize() <= DEFAULT_LIMIT
    assert len(got.stdout) + len(got.stderr) > DEFAULT_LIMIT - 64 * 1024  # cut, not emptied


def test_run_with_lossy_text_counts_the_text_too(
    plain: grpc.Channel, new_session: SessionFactory
) -> None:
    # Invalid UTF-8 becomes U+FFFD in stdout_text: 3 bytes of text per byte of output.
    s = new_session(limits=BIG)
    script = "head -c 3000000 /dev/urandom; head -c 3000000 /dev/urandom >&2; exit 4"
    got = process_pb2_grpc.ProcessServiceStub(plain).Run(
        process_pb2.RunRequest(
            session_id=s.session_id,
            argv=["sh", "-c", script],
            max_output_bytes=16 * MiB,
            output_encoding="OUTPUT_ENCODING_UTF8_LOSSY",
        ),
        timeout=120,
    )
    assert got.exit_code == 4 and got.truncated
    assert got.ByteSize() <= DEFAULT_LIMIT
    assert got.stdout_text == got.stdout.decode("utf-8", errors="replace")


def test_max_reply_bytes_lets_a_raised_client_have_more(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    # stubs' channel accepts 64 MiB; the server's own limit (17 MiB) bounds the field.
    s = new_session(limits=BIG)
    script = "head -c 9000000 /dev/zero; head -c 9000000 /dev/zero >&2; exit 3"
    got = run(
        stubs,
        s.session_id,
        "sh",
        "-c",
        script,
        max_output_bytes=16 * MiB,
        max_reply_bytes=64 * MiB,
    )
    assert got.exit_code == 3 and got.truncated
    assert 9_000_000 < len(got.stdout) + len(got.stderr) and got.ByteSize() <= 17 * MiB
    with pytest.raises(grpc.RpcError) as caught:
        run(stubs, s.session_id, "true", max_reply_bytes=-1)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_read_file_larger_than_a_reply_names_the_streaming_rpc(
    plain: grpc.Channel, stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=BIG)
    made = run(stubs, s.session_id, "sh", "-c", "head -c 10000000 /dev/zero > big.bin")
    assert made.exit_code == 0, made.stderr
    files = filesystem_pb2_grpc.FilesystemServiceStub(plain)
    with pytest.raises(grpc.RpcError) as caught:
        files.ReadFile(filesystem_pb2.ReadFileRequest(session_id=s.session_id, path="big.bin"))
    assert _refused_by_reason(caught.value) == "REPLY_TOO_LARGE"
    assert "ReadFileStream" in caught.value.details()  # type: ignore[attr-defined]
    # The streaming RPC reads it whole over the same default channel, in small chunks.
    streamed = files.ReadFileStream(
        filesystem_pb2.ReadFileStreamRequest(session_id=s.session_id, path="big.bin")
    )
    assert sum(len(m.chunk.data) for m in streamed) == 10_000_000
    # A client that accepts more says so, and gets the file in one reply.
    whole = stubs.files.ReadFile(
        filesystem_pb2.ReadFileRequest(
            session_id=s.session_id, path="big.bin", max_reply_bytes=32 * MiB
        )
    )
    assert len(whole.content) == 10_000_000


def test_a_big_listing_is_paged_within_the_limit_or_refused_whole(
    plain: grpc.Channel, stubs: Stubs, new_session: SessionFactory
) -> None:
    # 1200 files 16 levels down (4 KiB paths): a 1000-entry page would be about 4.3 MB.
    s = new_session(limits=BIG)
    chain = "/".join(["d" * 250] * 15)
    script = (
        f'mkdir -p "{chain}" && awk -v d="{chain}" '
        '\'BEGIN { for (i = 0; i < 1200; i++) { f = sprintf("%s/%0250d", d, i); '
        'printf "" > f; close(f) } }\''
    )
    made = run(stubs, s.session_id, "sh", "-c", script, timeout=duration_pb2.Duration(seconds=120))
    assert made.exit_code == 0, made.stderr
    files = filesystem_pb2_grpc.FilesystemServiceStub(plain)
    with pytest.raises(grpc.RpcError) as caught:
        files.ListDir(filesystem_pb2.ListDirRequest(session_id=s.session_id, depth=32))
    assert _refused_by_reason(caught.value) == "LISTING_TOO_LARGE"
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = files.ListDir(
            filesystem_pb2.ListDirRequest(
                session_id=s.session_id, depth=32, page_size=1000, page_token=token
            )
        )
        assert page.ByteSize() <= DEFAULT_LIMIT
        seen += [e.path for e in page.entries]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages >= 2
    assert len(seen) == len(set(seen)) == 1200 + 15
    assert seen == sorted(seen)
