"""Old shapes still answer: each deprecated field is filled beside its new twin."""

from __future__ import annotations

import io
import tarfile

from conftest import SessionFactory, Stubs
from sandboxd.v1 import admin_pb2, filesystem_pb2, snapshot_pb2, snapshot_pb2_grpc


def test_deprecated_fields_are_filled_beside_their_twins(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    assert info.lease_max.ToSeconds() == info.lease_max_seconds > 0
    lease = info.security_defaults.lease
    assert lease.ToSeconds() == info.security_defaults.lease_seconds > 0

    sid = new_session().session_id
    wrote = stubs.files.WriteFile(
        filesystem_pb2.WriteFileRequest(session_id=sid, path="f", content=b"12345")
    ).info
    assert wrote.size == wrote.size_bytes == 5
    read = stubs.files.ReadFile(filesystem_pb2.ReadFileRequest(session_id=sid, path="f"))
    assert read.size == read.size_bytes == 5

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        member = tarfile.TarInfo("t.txt")
        member.size = 3
        tar.addfile(member, io.BytesIO(b"abc"))
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    header = snapshot_pb2.ImportArchiveHeader(session_id=sid, path="in")
    imported = snaps.ImportArchive(
        iter(
            [
                snapshot_pb2.ImportArchiveRequest(header=header),
                snapshot_pb2.ImportArchiveRequest(data=buf.getvalue()),
            ]
        )
    )
    assert imported.bytes == imported.content_bytes == 3


def test_make_dir_takes_make_parents_and_still_parents(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    for i, fields in enumerate(({"parents": True}, {"make_parents": True})):
        info = stubs.files.MakeDir(
            filesystem_pb2.MakeDirRequest(session_id=sid, path=f"a{i}/b/c", **fields)  # type: ignore[arg-type]
        ).info
        assert info.path == f"a{i}/b/c"
