"""The server's own disk full, end to end: a real server whose data directory is a small tmpfs.

Filled to the last block, CreateSession is refused RESOURCE_EXHAUSTED SERVER_DISK_FULL naming
the directory and leaves no container of the server's owner behind; GetSession and
ListSessions still answer (Run is refused the same way: its audit records cannot be kept);
once space is freed the next CreateSession succeeds, no restart. The tmpfs is mounted for the
test and always unmounted after it (skipped where mounting is not permitted).
"""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import make_stubs, remove_owned_containers, start_server
from containers import owned_containers
from google.rpc import error_details_pb2, status_pb2
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

CALL_TIMEOUT = 60.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "data"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace')}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory: Path) -> Path:
    """A file that takes every free block of `directory`'s file system."""
    filler = directory / "filler"
    block = b"\0" * 65536
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(block)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    # What buffered writes left: single bytes until none fits.
    fd = os.open(filler, os.O_WRONLY | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _reason(err: grpc.RpcError) -> str:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            info = error_details_pb2.ErrorInfo()
            status_pb2.Status.FromString(value).details[0].Unpack(info)
            return info.reason
    return ""


def test_create_session_on_a_full_data_dir_is_refused_cleanly_and_recovers(
    small_disk: Path,
) -> None:
    owner = "dfull" + secrets.token_hex(4)
    srv = start_server(small_disk, owner)
    stubs = make_stubs(srv.address)
    create = session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    try:
        first = stubs.sessions.CreateSession(create, timeout=CALL_TIMEOUT).session.session_id
        before = set(owned_containers(owner))
        filler = _fill(small_disk)
        refusals, created = [], 0
        for _ in range(5):  # WAL pages SQLite already holds may take a write or two first
            try:
                stubs.sessions.CreateSession(create, timeout=CALL_TIMEOUT)
                created += 1
            except grpc.RpcError as err:
                refusals.append(err)
                break
        assert refusals, "CreateSession kept succeeding on a full data directory"
        err = refusals[0]
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        assert _reason(err) == "SERVER_DISK_FULL"
        assert "data directory" in (err.details() or "")
        assert str(small_disk) not in (err.details() or "")  # the host's path: the log's
        # Reads answer on the full disk; the refused create left no container.
        got = stubs.sessions.GetSession(
            session_pb2.GetSessionRequest(session_id=first), timeout=CALL_TIMEOUT
        ).session
        assert got.session_id == first
        listed = stubs.sessions.ListSessions(
            session_pb2.ListSessionsRequest(), timeout=CALL_TIMEOUT
        ).sessions
        assert first in {s.session_id for s in listed}
        assert len(listed) == 1 + created
        assert len(owned_containers(owner)) == len(before) + created
        # A command in the running session runs, but its audit records cannot be committed:
        # the call is answered so (the audit log's promise), never INTERNAL or UNAVAILABLE.
        with pytest.raises(grpc.RpcError) as ran:
            stubs.processes.Run(
                process_pb2.RunRequest(session_id=first, argv=["true"]), timeout=CALL_TIMEOUT
            )
        assert ran.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ran.value.details()
        assert _reason(ran.value) == "SERVER_DISK_FULL"
        # Space returns: the same server creates again.
        filler.unlink()
        again = stubs.sessions.CreateSession(create, timeout=CALL_TIMEOUT).session.session_id
        assert again != first
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)
