"""Images from a registry, against a real distribution registry on loopback.

Debian's `docker-registry` runs on 127.0.0.1 with htpasswd auth for this module only; the
runtime image is pushed to it under test tags and untagged locally, so every create below
finds it absent from the engine and must pull it (its layers stay local: pulls are quick).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    remove_owned_containers,
    start_server,
)
from registryutil import Registry, start_registry
from sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    images_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

TAG = secrets.token_hex(4)
BUILT: list[str] = []  # local images the tests built; removed with the registry


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry") / "reg")
    yield reg
    subprocess.run(["docker", "rmi", "-f", *BUILT], capture_output=True, check=False)
    for ref in reg.pushed:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, check=False)
    images = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", reg.host + "/*"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    digests = subprocess.run(
        ["docker", "images", "--digests", "--format", "{{.Repository}}@{{.Digest}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    leftovers = images + [d for d in digests if d.startswith(reg.host + "/")]
    if leftovers:
        subprocess.run(["docker", "rmi", "-f", *leftovers], capture_output=True, check=False)
    reg.stop()


@contextlib.contextmanager
def _server(
    tmp: pytest.TempPathFactory, registry: Registry, name: str, *extra: str
) -> Iterator[tuple[ServerProcess, Stubs]]:
    data = tmp.mktemp(name)
    owner = "reg" + secrets.token_hex(4)
    srv = start_server(
        data / "data",
        owner,
        "--image-allowlist",
        f"{registry.host}/rt*,{registry.host}/rt@*",
        *extra,
    )
    stubs = make_stubs(f"127.0.0.1:{srv.port}")
    try:
        yield srv, stubs
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)


@pytest.fixture(scope="module")
def main(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Stubs]:
    auth = registry.write_auth(tmp_path_factory.mktemp("auth") / "auth.json", registry.password)
    with _server(tmp_path_factory, registry, "main", "--registry-auth-file", str(auth)) as pair:
        srv, stubs = pair
        stubs.server = srv  # type: ignore[attr-defined]
        yield stubs


def _create(s: Stubs, image: str, policy: int = 0) -> session_pb2.Session:
    return s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            image=image, shell=common_pb2.ShellPolicy(allow_all=True), pull_policy=policy
        ),
        timeout=120,
    ).session


def _pulls(s: Stubs, ref: str) -> int:
    log: str = s.server.log()  # type: ignore[attr-defined]
    return sum(1 for line in log.splitlines() if "pulling image" in line and ref in line)


def _local(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def _runs_label(s: Stubs, session_id: str) -> str:
    """The `sandboxd.test` label of the image the session's container runs."""
    srv: ServerProcess = s.server  # type: ignore[attr-defined]
    name = f"sandboxd-{srv.owner_id}-{session_id}"
    image = subprocess.run(
        ["docker", "inspect", "--format", "{{.Image}}", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    labels = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return str((json.loads(labels) or {}).get("sandboxd.test", ""))


def _build(tag: str, label: str) -> str:
    BUILT.append(tag)
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, "-"],
        input=f"FROM {IMAGE}\nLABEL sandboxd.test={label}\n",
        text=True,
        check=True,
        capture_output=True,
    )
    return tag


def test_create_pulls_an_absent_image_once_and_records_its_digest(
    main: Stubs, registry: Registry
) -> None:
    digest = registry.push(IMAGE, f"rt:a-{TAG}")
    ref = f"{registry.host}/rt:a-{TAG}"
    assert not _local(ref)
    first = _create(main, ref)
    assert first.state == session_pb2.SESSION_STATE_RUNNING
    assert first.image_digest == digest
    assert _local(ref)
    second = _create(main, ref)
    assert second.image_digest == digest
    assert _pulls(main, ref) == 1, "the second create pulled again"
    listed = {i.name: i for i in main.admin.ListImages(images_pb2.ListImagesRequest()).images}
    assert listed[ref].digest == digest and listed[ref].HasField("last_used_at")


def test_never_refuses_an_absent_image(main: Stubs, registry: Registry) -> None:
    registry.push(IMAGE, f"rt:never-{TAG}")
    ref = f"{registry.host}/rt:never-{TAG}"
    expect_error(
        lambda: _create(main, ref, images_pb2.PULL_POLICY_NEVER),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IMAGE_NOT_FOUND",
    )
    assert _pulls(main, ref) == 0 and not _local(ref)


def test_always_sees_a_repushed_tag_and_resume_keeps_the_old_digest(
    main: Stubs, registry: Registry
) -> None:
    ref = f"{registry.host}/rt:moving-{TAG}"
    old = registry.push(_build(f"sandboxd-test-moving:{TAG}-1", "one"), f"rt:moving-{TAG}")
    first = _create(main, ref, images_pb2.PULL_POLICY_ALWAYS)
    assert first.image_digest == old
    again = _create(main, ref, images_pb2.PULL_POLICY_ALWAYS)  # unchanged: no second pull
    assert again.image_digest == old and _pulls(main, ref) == 1
    new = registry.push(_build(f"sandboxd-test-moving:{TAG}-2", "two"), f"rt:moving-{TAG}")
    assert new != old
    moved = _create(main, ref, images_pb2.PULL_POLICY_ALWAYS)
    assert moved.image_digest == new
    # The first session, suspended and resumed after the tag moved, runs what it ran.
    sid = first.session_id
    main.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    resumed = main.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    assert resumed.session.image_digest == old
    assert _runs_label(main, sid) == "one"


def test_a_digest_reference_is_pulled_and_recorded(main: Stubs, registry: Registry) -> None:
    digest = registry.push(IMAGE, f"rt:bydigest-{TAG}")
    session = _create(main, f"{registry.host}/rt@{digest}")
    assert session.image_digest == digest
    assert session.image == f"{registry.host}/rt@{digest}"


def test_unknown_repository_and_image_outside_the_allowlist(
    main: Stubs, registry: Registry
) -> None:
    expect_error(
        lambda: _create(main, f"{registry.host}/rt-missing:{TAG}"),
        grpc.StatusCode.NOT_FOUND,
        "REGISTRY_IMAGE_NOT_FOUND",
    )
    before = registry.manifest_requests()
    expect_error(
        lambda: _create(main, f"{registry.host}/secret:{TAG}"),
        grpc.StatusCode.PERMISSION_DENIED,
        "IMAGE_NOT_ALLOWED",
    )
    assert registry.manifest_requests() == before, "the registry was asked first"


def test_two_concurrent_creates_make_one_pull(main: Stubs, registry: Registry) -> None:
    registry.push(IMAGE, f"rt:conc-{TAG}")
    ref = f"{registry.host}/rt:conc-{TAG}"
    results: list[object] = []

    def create() -> None:
        try:
            results.append(_create(main, ref).image_digest)
        except grpc.RpcError as exc:
            results.append(exc)

    threads = [threading.Thread(target=create) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and all(isinstance(r, str) and r for r in results), results
    assert _pulls(main, ref) == 1


def test_pull_image_streams_progress_and_list_images_shows_it(
    main: Stubs, registry: Registry
) -> None:
    digest = registry.push(IMAGE, f"rt:prewarm-{TAG}")
    ref = f"{registry.host}/rt:prewarm-{TAG}"
    events = list(main.admin.PullImage(images_pb2.PullImageRequest(image=ref), timeout=120))
    assert events[-1].WhichOneof("event") == "done"
    assert events[-1].done.image_digest == digest
    assert any(e.WhichOneof("event") == "progress" for e in events[:-1])
    listed = main.admin.ListImages(images_pb2.ListImagesRequest())
    names = {i.name: i for i in listed.images}
    assert names[ref].digest == digest and names[ref].size_bytes > 0
    expect_error(
        lambda: list(main.admin.PullImage(images_pb2.PullImageRequest(image="busybox:1"))),
        grpc.StatusCode.PERMISSION_DENIED,
        "IMAGE_NOT_ALLOWED",
    )


def test_wrong_credentials(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> None:
    bad = registry.write_auth(tmp_path_factory.mktemp("bad") / "auth.json", "wrong")
    registry.push(IMAGE, f"rt:creds-{TAG}")
    with _server(tmp_path_factory, registry, "bad", "--registry-auth-file", str(bad)) as (srv, s):
        expect_error(
            lambda: _create(s, f"{registry.host}/rt:creds-{TAG}"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "REGISTRY_UNAUTHORIZED",
        )
        assert "wrong" not in srv.log() and registry.password not in srv.log()


def test_over_the_size_cap(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> None:
    auth = registry.write_auth(tmp_path_factory.mktemp("cap") / "auth.json", registry.password)
    registry.push(IMAGE, f"rt:cap-{TAG}")
    ref = f"{registry.host}/rt:cap-{TAG}"
    with _server(
        tmp_path_factory,
        registry,
        "cap",
        "--registry-auth-file",
        str(auth),
        "--max-image-bytes",
        "1000",
    ) as (srv, s):
        expect_error(lambda: _create(s, ref), grpc.StatusCode.RESOURCE_EXHAUSTED, "IMAGE_TOO_LARGE")
        assert not _local(ref)


def test_sweep_removes_an_unused_pulled_image_and_keeps_one_in_use(
    tmp_path_factory: pytest.TempPathFactory, registry: Registry
) -> None:
    auth = registry.write_auth(tmp_path_factory.mktemp("sw") / "auth.json", registry.password)
    registry.push(IMAGE, f"rt:unused-{TAG}")
    registry.push(IMAGE, f"rt:used-{TAG}")
    unused, used = f"{registry.host}/rt:unused-{TAG}", f"{registry.host}/rt:used-{TAG}"
    with _server(
        tmp_path_factory,
        registry,
        "sweep",
        "--registry-auth-file",
        str(auth),
        "--image-unused-after-s",
        "0",
    ) as (srv, s):
        gone = _create(s, unused)
        s.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=gone.session_id))
        _create(s, used)
        admin = admin_pb2_grpc.AdminServiceStub(s.channel)
        admin.Sweep(admin_pb2.SweepRequest())
        assert not _local(unused)
        assert _local(used)


def test_sandboxctl_image_pull_and_ls(main: Stubs, registry: Registry) -> None:
    digest = registry.push(IMAGE, f"rt:ctl-{TAG}")
    ref = f"{registry.host}/rt:ctl-{TAG}"
    srv: ServerProcess = main.server  # type: ignore[attr-defined]
    ctl = [str(Path(sys.executable).parent / "sandboxctl"), "--addr", srv.address]
    pulled = subprocess.run(
        [*ctl, "image", "pull", "--progress", ref], capture_output=True, text=True, timeout=120
    )
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == digest
    assert ref in pulled.stderr  # the progress line names the image
    listed = subprocess.run(
        [*ctl, "-o", "json", "image", "ls"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows[ref]["digest"] == digest and rows[ref]["size_bytes"] > 0
    refused = subprocess.run(
        [*ctl, "image", "pull", f"{registry.host}/secret:{TAG}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 125 and "IMAGE_NOT_ALLOWED" in refused.stderr
    registry.push(IMAGE, f"rt:ctl-never-{TAG}")
    never = subprocess.run(
        [
            *ctl,
            "create",
            "--image",
            f"{registry.host}/rt:ctl-never-{TAG}",
            "--pull-policy",
            "NEVER",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert never.returncode == 125 and "IMAGE_NOT_FOUND" in never.stderr


def test_registry_unreachable(tmp_path_factory: pytest.TempPathFactory) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    owner = "reg" + secrets.token_hex(4)
    data = tmp_path_factory.mktemp("unreachable")
    srv = start_server(data / "data", owner, "--image-allowlist", f"{closed}/*")
    s = make_stubs(f"127.0.0.1:{srv.port}")
    try:
        expect_error(
            lambda: _create(s, f"{closed}/rt:{TAG}"),
            grpc.StatusCode.UNAVAILABLE,
            "REGISTRY_UNREACHABLE",
        )
        listed = s.sessions.ListSessions(session_pb2.ListSessionsRequest())
        assert list(listed.sessions) == []  # nothing of the session was made
    finally:
        s.channel.close()
        srv.stop()
        remove_owned_containers(owner)


def test_a_fork_runs_its_sources_digest_after_the_tag_moved(
    main: Stubs, registry: Registry
) -> None:
    ref = f"{registry.host}/rt:fork-{TAG}"
    old = registry.push(_build(f"sandboxd-test-fork:{TAG}-1", "fork-one"), f"rt:fork-{TAG}")
    source = _create(main, ref)
    assert source.image_digest == old
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(main.channel)
    snap = snaps.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=source.session_id)
    ).snapshot
    new = registry.push(_build(f"sandboxd-test-fork:{TAG}-2", "fork-two"), f"rt:fork-{TAG}")
    assert _create(main, ref, images_pb2.PULL_POLICY_ALWAYS).image_digest == new
    fork = main.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            image=ref,
            from_snapshot_id=snap.snapshot_id,
            shell=common_pb2.ShellPolicy(allow_all=True),
        ),
        timeout=120,
    ).session
    assert fork.image_digest == old
    ran = main.processes.Run(
        process_pb2.RunRequest(session_id=fork.session_id, argv=["true"]), timeout=60
    )
    assert ran.exit_code == 0
    assert _runs_label(main, fork.session_id) == "fork-one"
