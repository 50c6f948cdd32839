"""The warm pool against the real engine: claims, never twice, shapes, drain, restart, sweeps."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    Stubs,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2

POOL = 2
_METRICS_RE = re.compile(r"metrics served at http://(\S+):(\d+)/metrics")


def containers(owner: str, *labels: str) -> list[dict[str, object]]:
    args = [
        "docker",
        "ps",
        "-a",
        "--format",
        "{{json .}}",
        "--filter",
        f"label=io.sandboxd.owner={owner}",
    ]
    for label in labels:
        args += ["--filter", f"label={label}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def pool_members(owner: str) -> list[dict[str, object]]:
    return containers(owner, "io.sandboxd.pool")


def metric(server: ServerProcess, name: str) -> float:
    m = _METRICS_RE.search(server.log())
    assert m, server.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{m.group(2)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def pool_full(server: ServerProcess) -> bool:
    return metric(server, "sandboxd_pool_available") >= POOL


def create(stubs: Stubs, **fields: object) -> session_pb2.Session:
    fields.setdefault("shell", common_pb2.ShellPolicy(allow_all=True))
    resp = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(**fields))  # type: ignore[arg-type]
    return resp.session


@pytest.fixture
def pooled(tmp_path: Path) -> Iterator[tuple[ServerProcess, Stubs]]:
    owner = "pool" + secrets.token_hex(4)
    srv = start_server(tmp_path, owner, "--pool-size", str(POOL), "--metrics-listen", "127.0.0.1:0")
    stubs = make_stubs(srv.address)
    try:
        assert wait_until(lambda: pool_full(srv), timeout=60), srv.log()
        yield srv, stubs
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)


def test_default_session_is_served_warm_with_its_files(
    pooled: tuple[ServerProcess, Stubs],
) -> None:
    srv, stubs = pooled
    members = {c["ID"] for c in pool_members(srv.owner_id)}
    assert len(members) == POOL
    s = create(
        stubs,
        workspace=session_pb2.WorkspaceManifest(
            files=[session_pb2.ManifestFile(path="dir/hello.txt", content=b"hello\n")]
        ),
    )
    assert metric(srv, 'sandboxd_pool_claims_total{result="hit"}') == 1
    assert run(stubs, s.session_id, "cat", "dir/hello.txt").stdout == b"hello\n"
    # The session runs in a former pool member; the pool refills behind it.
    assert wait_until(lambda: pool_full(srv), timeout=60)
    assert len(pool_members(srv.owner_id)) == POOL + 1
    # Pool containers carry the pool label, not the session's: the link is the stored id.
    assert not containers(srv.owner_id, f"io.sandboxd.session={s.session_id}")


def test_a_container_is_never_handed_out_twice(pooled: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = pooled
    with ThreadPoolExecutor(6) as workers:
        sessions = list(workers.map(lambda _i: create(stubs), range(6)))
    ids = [s.session_id for s in sessions]
    for sid in ids:
        assert run(stubs, sid, "sh", "-c", f"echo {sid} > mine").exit_code == 0
    for sid in ids:
        assert run(stubs, sid, "cat", "mine").stdout == f"{sid}\n".encode()
    assert wait_until(lambda: pool_full(srv), timeout=60)
    assert len(containers(srv.owner_id)) == len(ids) + POOL


def test_other_shapes_are_created_cold(pooled: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = pooled
    s = create(stubs, env={"X": "1"})
    assert containers(srv.owner_id, f"io.sandboxd.session={s.session_id}")
    assert metric(srv, 'sandboxd_pool_claims_total{result="other_shape"}') == 1
    assert metric(srv, "sandboxd_pool_available") == POOL
    assert run(stubs, s.session_id, "sh", "-c", "echo $X").stdout == b"1\n"


def test_members_removed_by_hand_are_not_handed_out(pooled: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = pooled
    ids = [str(c["ID"]) for c in pool_members(srv.owner_id)]
    subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=True)
    s = create(stubs)
    assert run(stubs, s.session_id, "true").exit_code == 0
    assert wait_until(lambda: pool_full(srv), timeout=60)


def test_shutdown_drains_the_pool_and_keeps_sessions(pooled: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = pooled
    s = create(stubs)
    assert wait_until(lambda: pool_full(srv), timeout=60)
    assert srv.stop() == 0
    left = pool_members(srv.owner_id)
    assert len(left) == 1, left  # only the claimed one, which belongs to the session
    # A restarted server (its own pool generation) still knows the session and its container.
    again = start_server(srv.data_dir, srv.owner_id, "--pool-size", "1")
    stubs2 = make_stubs(again.address)
    try:
        assert run(stubs2, s.session_id, "true").exit_code == 0
    finally:
        stubs2.channel.close()
        again.stop()


def test_restart_after_a_crash_removes_unclaimed_leftovers(
    pooled: tuple[ServerProcess, Stubs],
) -> None:
    srv, stubs = pooled
    s = create(stubs)
    assert wait_until(lambda: pool_full(srv), timeout=60)
    srv.stop(signal.SIGKILL)  # no drain: two unclaimed members are left behind
    assert len(pool_members(srv.owner_id)) == POOL + 1
    again = start_server(srv.data_dir, srv.owner_id)  # no pool: reconcile alone cleans up
    stubs2 = make_stubs(again.address)
    try:
        assert len(pool_members(srv.owner_id)) == 1
        assert run(stubs2, s.session_id, "true").exit_code == 0
        stubs2.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
        assert pool_members(srv.owner_id) == []
    except grpc.RpcError as err:
        raise AssertionError(again.log()) from err
    finally:
        stubs2.channel.close()
        again.stop()


def test_sweeps_leave_the_pool_and_claims_alone(pooled: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = pooled
    members = {str(c["ID"]) for c in pool_members(srv.owner_id)}
    with ThreadPoolExecutor(4) as workers:
        creating = [workers.submit(create, stubs) for _ in range(3)]
        sweeps = [workers.submit(stubs.admin.Sweep, admin_pb2.SweepRequest()) for _ in range(3)]
        sessions = [f.result() for f in creating]
        removed = sum(f.result().removed_containers for f in sweeps)
    assert removed == 0
    for s in sessions:
        assert run(stubs, s.session_id, "true").exit_code == 0
    assert members <= {str(c["ID"]) for c in containers(srv.owner_id)}  # claimed or still held
