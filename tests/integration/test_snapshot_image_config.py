"""An IMAGE snapshot carries the sandbox's filesystem and nothing of its runtime config.

`docker commit` merges the committed container's Env, Cmd, User and Labels into the image;
a session started from a snapshot image of a session given secrets in its env would run with
them. The image must carry only what its base image had (plus the snapshot's labels).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
from conftest import IMAGE, ServerProcess, SessionFactory, Stubs, run, wait_until
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
)

SECRET = "SECRET_X"


def image_config(image: str) -> dict[str, Any]:
    out = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config: dict[str, Any] = json.loads(out)
    return config


def test_image_snapshot_keeps_the_base_image_config_not_the_sessions(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory
) -> None:
    sid = new_session(env={SECRET: "y", "OTHER_VAR": "z"}, labels={"team": "a"}).session_id
    seen = run(stubs, sid, "env")
    assert f"{SECRET}=y" in seen.stdout.decode()  # the session itself has it
    snap = (
        snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
        .CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(
                session_id=sid, kind=snapshot_pb2.SNAPSHOT_KIND_IMAGE
            )
        )
        .snapshot
    )
    base = image_config(IMAGE)
    committed = image_config(snap.image)
    assert committed.get("Env") == base.get("Env")
    assert committed.get("Cmd") == base.get("Cmd")
    assert committed.get("Entrypoint") == base.get("Entrypoint")
    assert committed.get("User") == base.get("User")
    assert committed.get("WorkingDir") == base.get("WorkingDir")
    labels = committed.get("Labels") or {}
    assert labels["io.sandboxd.owner"] == server.owner_id
    assert labels["io.sandboxd.session"] == sid
    assert labels["io.sandboxd.snapshot"] == snap.snapshot_id
    assert "io.sandboxd.fingerprint" not in labels  # the sandbox's own bookkeeping stays out
    assert "team" not in labels
    for key, value in (base.get("Labels") or {}).items():
        assert labels[key] == value

    fork = new_session(image=snap.image).session_id
    env = run(stubs, fork, "env")
    assert env.exit_code == 0, env.stderr
    text = env.stdout.decode()
    assert SECRET not in text and "OTHER_VAR" not in text
    assert "PATH=" in text  # the server's base environment still applies


def test_an_image_snapshot_of_a_template_session_outlives_the_template(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """A template's images are pruned by its build label when it is deleted, which it may be
    once its sessions have ended; an image snapshot of such a session (kept, and runnable by
    its tenant) is not the template's and must stay."""
    tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
    name = "snapbase-" + secrets.token_hex(3)
    spec = template_pb2.TemplateSpec(name=name, dockerfile="FROM busybox\n")
    with _template_removed(stubs, name):
        for _ in tpl.BuildTemplate(
            iter([template_pb2.BuildTemplateRequest(spec=spec)]), timeout=120
        ):
            pass
        _snapshot_outlives_template(stubs, new_session, name)


@contextlib.contextmanager
def _template_removed(stubs: Stubs, name: str) -> Iterator[None]:
    """The template (its images carry no owner label: no server teardown finds them) goes,
    also on failure: after its sessions (labelled with its name), which hold it."""
    try:
        yield
    finally:
        listed = stubs.sessions.ListSessions(
            session_pb2.ListSessionsRequest(label_selector={"template": name})
        )
        for s in listed.sessions:
            with contextlib.suppress(grpc.RpcError):
                stubs.sessions.DeleteSession(
                    session_pb2.DeleteSessionRequest(session_id=s.session_id)
                )
        tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
        with contextlib.suppress(grpc.RpcError):  # NOT_FOUND: the test deleted it
            tpl.DeleteTemplate(template_pb2.DeleteTemplateRequest(name=name))


def _snapshot_outlives_template(stubs: Stubs, new_session: SessionFactory, name: str) -> None:
    tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
    snap_stub = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    sid = new_session(
        template=name, lease_ttl=duration_pb2.Duration(seconds=3), labels={"template": name}
    ).session_id
    snap = snap_stub.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=snapshot_pb2.SNAPSHOT_KIND_IMAGE)
    ).snapshot
    try:
        labels = image_config(snap.image).get("Labels") or {}
        assert not labels.get("io.sandboxd.template.build"), labels

        def state() -> int:
            got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid))
            return int(got.session.state)

        assert wait_until(lambda: state() == session_pb2.SESSION_STATE_EXPIRED, timeout=30)
        tpl.DeleteTemplate(template_pb2.DeleteTemplateRequest(name=name))
        exists = ["docker", "image", "inspect", snap.image]
        assert subprocess.run(exists, capture_output=True).returncode == 0, "snapshot image pruned"
        fork = new_session(image=snap.image).session_id  # still runnable by its tenant
        assert run(stubs, fork, "true").exit_code == 0
    finally:
        snap_stub.DeleteSnapshot(snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
