"""An IMAGE snapshot carries the sandbox's filesystem and nothing of its runtime config.

`docker commit` merges the committed container's Env, Cmd, User and Labels into the image;
a session started from a snapshot image of a session given secrets in its env would run with
them. The image must carry only what its base image had (plus the snapshot's labels).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from conftest import IMAGE, ServerProcess, SessionFactory, Stubs, run
from sandboxd.v1 import snapshot_pb2, snapshot_pb2_grpc

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
