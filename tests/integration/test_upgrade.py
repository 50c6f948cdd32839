"""A server upgraded over the data directory of release 0.1.0 (tests/data, written by that
release's server) keeps its sessions, files, snapshots and audit log: the suspended session
resumes with its file, its snapshots list, and its audit events read back."""

from __future__ import annotations

import json
import secrets
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

from conftest import IMAGE, make_stubs, remove_owned_containers, start_server
from sandboxd.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    filesystem_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

RELEASE = Path(__file__).resolve().parents[1] / "data" / "release-0.1.0" / "data"


def test_the_previous_releases_data_directory_serves_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(RELEASE, data)
    # The release's session was written with a 15-minute lease, long run out by now: the
    # upgrade is about its data, so its lease is made current first (only that column).
    # Its image was built on the release's machine: this host's build of the same recipe may
    # have another id (another Debian busybox), so the record names this host's build.
    image_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    with sqlite3.connect(data / "sessions.db") as db:
        db.execute("UPDATE sessions SET lease_expires_at = ?", (time.time() + 3600,))
        for sid, spec in db.execute("SELECT session_id, spec FROM sessions").fetchall():
            doc = json.loads(spec)
            doc.update(image_id=image_id, image_digest=image_id)
            db.execute("UPDATE sessions SET spec = ? WHERE session_id = ?", (json.dumps(doc), sid))
    owner = "upg" + secrets.token_hex(4)
    server = start_server(data, owner)
    stubs = make_stubs(server.address)
    try:
        session = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id="kept"))
        assert session.session.labels["team"] == "blue"
        assert session.session.state == session_pb2.SESSION_STATE_SUSPENDED
        stubs.sessions.ResumeSession(
            session_pb2.ResumeSessionRequest(session_id="kept"), timeout=60
        )
        read = stubs.files.ReadFile(
            filesystem_pb2.ReadFileRequest(session_id="kept", path="notes.txt"), timeout=30
        )
        assert read.content == b"hello\n"
        snapshots = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel).ListSnapshots(
            snapshot_pb2.ListSnapshotsRequest(session_id="kept")
        )
        assert len(snapshots.snapshots) >= 2
        events = audit_pb2_grpc.AuditServiceStub(stubs.channel).ListAuditEvents(
            audit_pb2.ListAuditEventsRequest(session_id="kept")
        )
        assert {"command", "file_write", "snapshot"} <= {e.kind for e in events.events}
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id="kept"))
    finally:
        stubs.channel.close()
        server.stop()
        remove_owned_containers(owner)
