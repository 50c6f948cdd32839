"""A missing path is NOT_FOUND FILE_NOT_FOUND in every RPC that takes one."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from conftest import SessionFactory, Stubs, expect_error
from sandboxd.v1 import (
    filesystem_pb2,
    process_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

F, E, P, N = filesystem_pb2, filesystem_pb2, process_pb2, snapshot_pb2


def _calls(stubs: Stubs, sid: str) -> dict[str, Callable[[], object]]:
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    missing = "no/such/thing"
    return {
        "ReadFile": lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path=missing)),
        "Stat": lambda: stubs.files.Stat(F.StatRequest(session_id=sid, path=missing)),
        "ListDir": lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, path=missing)),
        "Remove": lambda: stubs.files.Remove(F.RemoveRequest(session_id=sid, path=missing)),
        "WriteFile": lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path=missing, content=b"x")
        ),
        "MakeDir": lambda: stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path=missing)),
        "ReadFileStream": lambda: list(
            stubs.files.ReadFileStream(E.ReadFileStreamRequest(session_id=sid, path=missing))
        ),
        "Move": lambda: stubs.files.Move(
            E.MoveRequest(session_id=sid, source_path=missing, destination_path="x")
        ),
        "ExportArchive": lambda: list(
            snaps.ExportArchive(N.ExportArchiveRequest(session_id=sid, path=missing))
        ),
    }


NAMES = [
    "ReadFile",
    "Stat",
    "ListDir",
    "Remove",
    "WriteFile",
    "MakeDir",
    "ReadFileStream",
    "Move",
    "ExportArchive",
]


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_path_is_file_not_found(
    name: str, stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    assert sorted(_calls(stubs, sid)) == sorted(NAMES)
    expect_error(_calls(stubs, sid)[name], grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND")
