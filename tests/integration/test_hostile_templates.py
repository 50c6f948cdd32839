"""A hostile BuildTemplate against the real engine: no build step reaches the engine host's
network (the engine fetches `ADD <url>` itself, outside the network-less RUN steps), and no
build writes past max_image_bytes or leaves anything behind when it is stopped there."""

from __future__ import annotations

import io
import re
import secrets
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator

import context_polyglots
import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import ServerProcess, error_info, remove_owned_containers, start_server
from sandboxd.v1 import (
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
)

T = template_pb2
TOKEN = "h-" + secrets.token_urlsafe(16)
MiB = 1024 * 1024
CAP = 48 * MiB  # max_image_bytes of this server: busybox (~2 MiB) and a little more
LABEL_BUILD = "io.sandboxd.template.build"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("hostile-templates")
    server = start_server(
        tmp / "data",
        "htpl" + secrets.token_hex(4),
        "--tokens-file",
        str(write_tokens(tmp / "tokens", {TOKEN: "mallory"})),
        "--max-image-bytes",
        str(CAP),
        "--template-build-timeout-s",
        "120",
    )
    yield server
    server.stop()
    remove_owned_containers(server.owner_id)


@pytest.fixture(scope="module")
def tpl(srv: ServerProcess) -> template_pb2_grpc.TemplateServiceStub:
    return template_pb2_grpc.TemplateServiceStub(authed_stubs(srv.address, TOKEN).channel)


def _requests(
    name: str, dockerfile: str, context: bytes | None
) -> Iterator[T.BuildTemplateRequest]:
    yield T.BuildTemplateRequest(spec=T.TemplateSpec(name=name, dockerfile=dockerfile))
    if context is not None:
        yield T.BuildTemplateRequest(context=context)


def _build(
    tpl: template_pb2_grpc.TemplateServiceStub,
    name: str,
    dockerfile: str,
    context: bytes | None = None,
    timeout: float = 180,
):
    """(the log lines, the RpcError the build ended with, or None when it succeeded)."""
    lines: list[str] = []
    try:
        for resp in tpl.BuildTemplate(_requests(name, dockerfile, context), timeout=timeout):
            if resp.WhichOneof("event") == "log":
                lines.append(resp.log.line)
    except grpc.RpcError as e:
        return lines, e
    return lines, None


class Listener:
    """A TCP listener on the host's loopback that counts the connections it is offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


# Each a build the engine would fetch http://127.0.0.1:PORT/x for, from its own host. The
# first (an ARG) and the last (an ENV) passed the checker this server had, and the engine
# fetched the listener; the two between were refused by its `://` rule already.
FETCHING = [
    "FROM busybox\nARG U=http://127.0.0.1:{port}/x\nADD $U /opt/x\n",
    "FROM busybox\nENV H=127.0.0.1:{port}\nADD http://${{H}}/x /opt/x\n",
    "FROM busybox\nADD ${{U:-http://127.0.0.1:{port}/x}} /opt/x\n",
    "FROM busybox\nENV U=http://127.0.0.1:{port}/x\nRUN true\nADD $U /opt/x\n",
]


@pytest.mark.parametrize("template", FETCHING)
def test_no_build_step_reaches_the_engine_hosts_loopback(tpl, template: str) -> None:
    listener = Listener()
    try:
        lines, err = _build(
            tpl, "fetch-" + secrets.token_hex(3), template.format(port=listener.port)
        )
        time.sleep(0.5)  # a fetch the engine began would have connected by now
        assert listener.connections == 0, ("the engine fetched the URL", lines)
        assert err is not None, lines
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert error_info(err).reason == "TEMPLATE_INSTRUCTION_NOT_ALLOWED"
        assert "ADD is not allowed" in (err.details() or "")
    finally:
        listener.close()


# COPY never fetches: the checker leaves its `$` alone (it reads the context only), and the
# engine refuses a source that expands to a URL. Each must leave the listener untouched.
COPYING = [
    "FROM busybox\nARG U=http://127.0.0.1:{port}/x\nCOPY $U /opt/x\n",
    'FROM busybox\nARG U=http://127.0.0.1:{port}/x\nCOPY ["${{U}}", "/opt/x"]\n',
    "FROM busybox\nCOPY ${{U:-http://127.0.0.1:{port}/x}} /opt/x\n",
    "FROM busybox\nENV H=127.0.0.1:{port}\nCOPY http://$H/x /opt/x\n",
]


@pytest.mark.parametrize("template", COPYING)
def test_copy_never_fetches_a_url_however_expanded(tpl, template: str) -> None:
    listener = Listener()
    try:
        lines, err = _build(
            tpl, "copy-" + secrets.token_hex(3), template.format(port=listener.port)
        )
        time.sleep(0.5)
        assert listener.connections == 0, ("the engine fetched the URL", lines)
        assert err is not None, lines
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
        assert error_info(err).reason == "TEMPLATE_BUILD_FAILED"
    finally:
        listener.close()


def _labelled(kind: str, build_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", kind, "-aq", "--filter", f"label={LABEL_BUILD}={build_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


WRITERS = [
    # One file: stopped by the step's file size limit (the room left) as it writes.
    "RUN dd if=/dev/zero of=/big bs=1M count=400",
    # Many files, each under that limit: stopped by the build's measure while it runs.
    "RUN i=0; while [ $i -lt 200 ]; do dd if=/dev/zero of=/f$i bs=1M count=10 2>/dev/null;"
    " i=$((i+1)); done",
]


@pytest.mark.parametrize("step", WRITERS)
def test_a_run_writing_past_max_image_bytes_is_stopped_and_leaves_nothing(
    tpl, srv, step: str
) -> None:
    """Today's example: a `RUN dd` built a 401 MiB template past a 256 MiB cap."""
    name = "dd-" + secrets.token_hex(3)
    lines, err = _build(tpl, name, f"FROM busybox\n{step}\nRUN echo after\n")
    assert err is not None, ("a 400 MiB step was built past a 48 MiB cap", lines)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert error_info(err).reason == "IMAGE_TOO_LARGE"
    assert not any("echo after" in line for line in lines), lines
    _assert_nothing_left(lines)
    got = tpl.GetTemplate(T.GetTemplateRequest(name=name)).template
    assert got.state == T.TEMPLATE_STATE_FAILED and "max_image_bytes" in got.message
    assert "Traceback" not in srv.log(), srv.log()


def _assert_nothing_left(lines: list[str]) -> None:
    """No image or step container of the build the log names is left, once it settled."""
    (build_id,) = {m.group(1) for ln in lines if (m := re.search(rf'{LABEL_BUILD}="(\w+)"', ln))}
    # A stopped step's commit may land seconds later (a 400 MB layer): the server prunes
    # again until nothing of the build is seen twice in a row; so does this wait.
    deadline, quiet = time.monotonic() + 60, 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(4)
        left = _labelled("images", build_id) + _labelled("ps", build_id)
        quiet = quiet + 1 if not left else 0
    assert _labelled("images", build_id) == [], "an image of the stopped build was left"
    assert _labelled("ps", build_id) == [], "a step container of the stopped build was left"


def _context_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _symlink_context() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, target in (("etc", "/etc"), ("up", "../../../../../../etc")):
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("source", ["etc/hostname", "up/hostname", "etc/", "up/"])
def test_copy_through_a_context_symlink_never_reads_the_engine_host(tpl, source: str) -> None:
    """A context's symlinks to the engine host's /etc (absolute, or climbing with `..`): a
    COPY through them is resolved inside the context, so it finds nothing and the build fails;
    no file of the engine's host reaches the image."""
    name = "link-" + secrets.token_hex(3)
    dockerfile = f"FROM busybox\nCOPY {source} /got\n"
    lines, err = _build(tpl, name, dockerfile, _symlink_context(), timeout=120)
    assert err is not None, ("a COPY through a symlink out of the context was built", lines)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert error_info(err).reason == "TEMPLATE_BUILD_FAILED"
    assert "outside the build context" in (err.details() or "")


def test_a_context_the_engine_would_inflate_never_reaches_it(tpl) -> None:
    """A plain tar whose bytes are also a gzip stream of another tar: the engine picks its
    decompressor from the context's first bytes, so it would unpack the inner tar (here
    64 MiB of zeros from 64 KiB) and look for the server's Dockerfile in it. Refused before
    the engine sees it (before: the engine inflated it and answered "Cannot locate specified
    Dockerfile", a 2 MiB one was measured writing 2 GiB to its disk)."""
    name = "bomb-" + secrets.token_hex(3)
    context = context_polyglots.gzip_bomb(64 * MiB)
    assert len(context) < 128 * 1024 and context_polyglots.members(context)
    lines, err = _build(tpl, name, "FROM busybox\nCOPY . /x\n", context, timeout=120)
    assert err is not None, ("a context the engine would inflate was built", lines)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err).reason == "TEMPLATE_SPEC_INVALID"


def test_a_member_hidden_from_the_checks_never_reaches_the_engine(tpl) -> None:
    """A tar that the server's tarfile and the engine's Go reader cut differently (a global
    pax header's size, applied by tarfile to a later member and by Go to none): the member
    only Go reads, never checked, is not in the context the engine unpacks, so the COPY of
    it finds nothing (before: the engine unpacked it and the build copied it)."""
    name = "hidden-" + secrets.token_hex(3)
    hidden = context_polyglots.plain_member("hidden.txt", b"never checked\n")
    context = context_polyglots.pax_smuggled(hidden)
    lines, err = _build(tpl, name, "FROM busybox\nCOPY hidden.txt /h\n", context, timeout=120)
    assert err is not None, ("a member hidden from the checks was built", lines)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert error_info(err).reason == "TEMPLATE_BUILD_FAILED"
    assert "hidden.txt" in (err.details() or ""), err.details()


def test_copy_layers_past_max_image_bytes_are_stopped_and_leave_nothing(tpl, srv) -> None:
    """COPY is written by the engine itself, not by a step's process (no RLIMIT_FSIZE
    reaches it): eight COPYs of a 12 MiB context file make a 96 MiB image under a 48 MiB
    cap. The build's measure stops it, and nothing of it is left."""
    name = "copies-" + secrets.token_hex(3)
    copies = "".join(f"COPY blob /c{i}\n" for i in range(8))
    context = _context_tar({"blob": secrets.token_bytes(12 * MiB)})
    lines: list[str] = []
    requests = [
        T.BuildTemplateRequest(
            spec=T.TemplateSpec(name=name, dockerfile=(f"FROM busybox\n{copies}RUN echo after\n"))
        )
    ]
    requests += [
        T.BuildTemplateRequest(context=context[i : i + 64 * 1024])
        for i in range(0, len(context), 64 * 1024)
    ]
    err = None
    try:
        for resp in tpl.BuildTemplate(iter(requests), timeout=180):
            if resp.WhichOneof("event") == "log":
                lines.append(resp.log.line)
    except grpc.RpcError as e:
        err = e
    assert err is not None, ("96 MiB of COPY layers were built past a 48 MiB cap", lines)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert error_info(err).reason == "IMAGE_TOO_LARGE"
    assert not any("echo after" in line for line in lines), lines
    _assert_nothing_left(lines)
    assert "Traceback" not in srv.log(), srv.log()


@pytest.mark.parametrize(
    "label",
    [
        "io\\.sandboxd.template.build=other",
        'io.sand"boxd".template.build=other',
        "$K=other",
        "a=1 IO.SANDBOXD.template.name=other",
        "io.sandboxd.template.build other",
    ],
)
def test_the_label_namespace_is_the_servers_however_spelled(tpl, label: str) -> None:
    """The engine takes quotes and escapes out of a LABEL key and expands its variables: a
    key that would be io.sandboxd.* once it has is refused before the engine sees it."""
    dockerfile = f"FROM busybox\nARG K=io.sandboxd.template.build\nLABEL {label}\n"
    lines, err = _build(tpl, "label-" + secrets.token_hex(3), dockerfile)
    assert err is not None, ("the engine set a label of the server's", lines)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert error_info(err).reason == "TEMPLATE_INSTRUCTION_NOT_ALLOWED"


QUOTA = 5 * MiB  # the busybox runtime image is about 2 MiB: two image snapshots fit, not three


@pytest.fixture(scope="module")
def quota_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("image-quota")
    server = start_server(
        tmp / "data",
        "hquota" + secrets.token_hex(4),
        "--tokens-file",
        str(write_tokens(tmp / "tokens", {TOKEN: "mallory"})),
        "--tenant-max-image-bytes",
        str(QUOTA),
    )
    yield server
    server.stop()
    remove_owned_containers(server.owner_id)


def _images_of(owner_id: str) -> set[str]:
    out = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", "--filter", f"label=io.sandboxd.owner={owner_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_templates_and_image_snapshots_share_the_tenants_image_quota(quota_srv) -> None:
    stubs = authed_stubs(quota_srv.address, TOKEN)
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
    sid = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest()).session.session_id
    image = snapshot_pb2.SNAPSHOT_KIND_IMAGE
    try:
        kept = [
            snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=image))
            for _ in range(2)
        ]
        held = _images_of(quota_srv.owner_id)
        with pytest.raises(grpc.RpcError) as info:
            snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=image))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        assert error_info(info.value).reason == "TENANT_IMAGE_QUOTA"
        assert _images_of(quota_srv.owner_id) == held  # the third commit was taken back

        # A template is a tenant image too: with about 1 MiB of room, a busybox one stops.
        lines, err = _build(tpl, "q-" + secrets.token_hex(3), "FROM busybox\nRUN true\n")
        assert err is not None, lines
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        assert error_info(err).reason == "TENANT_IMAGE_QUOTA"

        snaps.DeleteSnapshot(
            snapshot_pb2.DeleteSnapshotRequest(snapshot_id=kept[0].snapshot.snapshot_id)
        )
        name = "q-" + secrets.token_hex(3)
        _, err = _build(tpl, name, "FROM busybox\nRUN true\n")
        assert err is None, err.details()  # room again
        tpl.DeleteTemplate(T.DeleteTemplateRequest(name=name))
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
