"""The durable audit log against a real server: what is recorded, who may read it, and that an
answered call's event survives the server being SIGKILLed at a random point under load."""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    make_stubs,
    own_server,
    remove_owned_containers,
    start_server,
)
from sandboxd.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
)

A, F, P, S = audit_pb2, filesystem_pb2, process_pb2, session_pb2
ALL = common_pb2.ShellPolicy(allow_all=True)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _audit(s: Stubs) -> audit_pb2_grpc.AuditServiceStub:
    return audit_pb2_grpc.AuditServiceStub(s.channel)


def _all_events(s: Stubs, **filters: object) -> list[audit_pb2.AuditEvent]:
    events: list[audit_pb2.AuditEvent] = []
    token = ""
    while True:
        page = _audit(s).ListAuditEvents(
            A.ListAuditEventsRequest(page_size=50, page_token=token, **filters)  # type: ignore[arg-type]
        )
        events += page.events
        token = page.next_page_token
        if not token:
            return events


@pytest.fixture(scope="module")
def audit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("audit")
    owner = "aud" + secrets.token_hex(4)
    with own_server(
        tmp / "data", owner, "--audit-export-path", str(tmp / "export" / "audit.jsonl")
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def au(audit_server: ServerProcess) -> Iterator[Stubs]:
    s = make_stubs(audit_server.address)
    yield s
    s.channel.close()


def test_commands_files_and_refusals_are_recorded_with_the_trace_id(
    au: Stubs, audit_server: ServerProcess
) -> None:
    traced = (("traceparent", TRACEPARENT),)
    sid = au.sessions.CreateSession(
        S.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow=["echo", "sh"]))
    ).session.session_id
    try:
        au.processes.Run(
            P.RunRequest(session_id=sid, argv=["sh", "-c", "echo hello; exit 3"]),
            metadata=traced,
        )
        au.files.WriteFile(F.WriteFileRequest(session_id=sid, path="notes.txt", content=b"12345"))
        au.files.Remove(F.RemoveRequest(session_id=sid, path="notes.txt"))
        with pytest.raises(grpc.RpcError) as refused:
            au.processes.Run(P.RunRequest(session_id=sid, argv=["rm", "-rf", "/workspace"]))
        reason = error_info(refused.value).reason

        events = _all_events(au, session_id=sid)
        by_kind = {e.kind: e for e in events}
        assert set(by_kind) >= {"lifecycle", "command", "file_write", "file_remove", "refused"}
        command = by_kind["command"]
        assert json.loads(command.attributes["argv"]) == ["sh", "-c", "echo hello; exit 3"]
        assert command.attributes["exit_code"] == "3"
        assert command.attributes["stdout_bytes"] == "6"
        assert command.attributes["cwd"] == "/workspace"
        assert command.trace_id == TRACE
        assert command.tenant == "default"
        assert by_kind["file_write"].attributes["path"] == "notes.txt"
        assert by_kind["file_write"].attributes["bytes"] == "5"
        assert by_kind["file_remove"].attributes["path"] == "notes.txt"
        assert by_kind["refused"].attributes["reason"] == reason
        assert by_kind["refused"].attributes["code"] == "PERMISSION_DENIED"
        assert by_kind["refused"].attributes["method"] == "ProcessService/Run"
        only = _all_events(au, session_id=sid, kinds=["command"])
        assert [e.kind for e in only] == ["command"]
    finally:
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_jsonl_export_is_readable_while_the_server_writes(
    au: Stubs, audit_server: ServerProcess
) -> None:
    path = audit_server.data_dir.parent / "export" / "audit.jsonl"
    sid = au.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            au.files.WriteFile(F.WriteFileRequest(session_id=sid, path=f"f{i}", content=b"x"))
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # read the file as a shipper would, mid-write
            # One read from the start, up to its last newline. (Not readlines(): a readline that
            # meets the end of the file mid-record returns that part, and the next one returns
            # the rest of the record, appended meanwhile, as if it were a line of its own.)
            data = path.read_bytes()
            complete = data[: data.rfind(b"\n") + 1].splitlines()
            docs = [json.loads(ln) for ln in complete]  # every complete line is one JSON object
            assert all({"id", "time", "tenant", "kind", "attributes"} <= d.keys() for d in docs)
            seen = max(seen, sum(1 for d in docs if d["session_id"] == sid))
        assert seen > 0
    finally:
        stop.set()
        writer.join()
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    stored = {e.id for e in _all_events(au, session_id=sid)}
    exported = {json.loads(ln)["id"] for ln in path.read_text().splitlines()}
    assert stored <= exported


def test_bad_listing_requests_are_refused(au: Stubs) -> None:
    with pytest.raises(grpc.RpcError) as bad_kind:
        _audit(au).ListAuditEvents(A.ListAuditEventsRequest(kinds=["nonsense"]))
    assert error_info(bad_kind.value).reason == "INVALID_AUDIT_KIND"
    with pytest.raises(grpc.RpcError) as bad_range:
        req = A.ListAuditEventsRequest()
        req.start_time.FromSeconds(2000)
        req.end_time.FromSeconds(1000)
        _audit(au).ListAuditEvents(req)
    assert error_info(bad_range.value).reason == "INVALID_TIME_RANGE"
    with pytest.raises(grpc.RpcError) as bad_token:
        _audit(au).ListAuditEvents(A.ListAuditEventsRequest(page_token="bm90LWFuLWlk"))
    assert error_info(bad_token.value).reason == "INVALID_PAGE_TOKEN"


# Tenant scoping ------------------------------------------------------------------------------

TOKENS = {
    "a-" + secrets.token_urlsafe(16): "alpha",
    "b-" + secrets.token_urlsafe(16): "beta",
    "r-" + secrets.token_urlsafe(16): "root",
}
TOKEN_OF = {tenant: token for token, tenant in TOKENS.items()}


def test_tenants_read_only_their_own_events_and_admins_any(
    tmp_path: Path,
) -> None:
    tokens = write_tokens(tmp_path / "tokens", TOKENS, {"root": "admin"})
    owner = "aut" + secrets.token_hex(4)
    srv = start_server(tmp_path / "data", owner, "--tokens-file", str(tokens))
    alpha, beta, root = (authed_stubs(srv.address, TOKEN_OF[t]) for t in ("alpha", "beta", "root"))
    try:
        sid = alpha.sessions.CreateSession(
            S.CreateSessionRequest(session_id="alpha.audited", shell=ALL)
        ).session.session_id
        alpha.files.WriteFile(F.WriteFileRequest(session_id=sid, path="a.txt", content=b"a"))
        with pytest.raises(grpc.RpcError):  # beta probing alpha's session is refused...
            beta.files.WriteFile(F.WriteFileRequest(session_id=sid, path="b.txt", content=b"b"))

        mine = _all_events(alpha)
        assert mine and {e.tenant for e in mine} == {"alpha"}
        theirs = _all_events(beta)
        assert {e.tenant for e in theirs} == {"beta"}  # ...and that refusal is beta's event
        assert not any(e.attributes.get("path") == "a.txt" for e in theirs)
        with pytest.raises(grpc.RpcError) as denied:
            _audit(beta).ListAuditEvents(A.ListAuditEventsRequest(tenant="alpha"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_info(denied.value).reason == "AUDIT_TENANT_NOT_ALLOWED"
        # Naming oneself is allowed; the refused cross-tenant read is itself recorded.
        again = _all_events(beta, tenant="beta")
        assert again[: len(theirs)] == theirs
        assert again[-1].attributes["reason"] == "AUDIT_TENANT_NOT_ALLOWED"

        as_admin = _all_events(root, tenant="alpha")
        assert [e.id for e in as_admin] == [e.id for e in mine]
        alpha.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    finally:
        for s in (alpha, beta, root):
            s.channel.close()
        srv.stop()
        remove_owned_containers(owner)


# Completeness under SIGKILL --------------------------------------------------------------------


def _load(s: Stubs, sid: str, prefix: str, stop: threading.Event, answered: list[str]) -> None:
    """Write files until stopped or the server dies; note each write that was answered."""
    i = 0
    while not stop.is_set():
        path = f"{prefix}-{i}"
        try:
            s.files.WriteFile(
                F.WriteFileRequest(session_id=sid, path=path, content=b"x"), timeout=10
            )
        except grpc.RpcError:
            return  # the server died mid-call: this one was never answered
        answered.append(path)  # list.append is atomic
        i += 1


def test_no_answered_call_loses_its_event_when_the_server_is_killed(tmp_path: Path) -> None:
    owner = "auk" + secrets.token_hex(4)
    data = tmp_path / "data"
    rng = random.Random()
    answered: list[str] = []
    sid = ""
    try:
        for round_no in range(3):
            # A batch window makes answered-but-uncommitted events likely if the promise were
            # broken (the call answered before its commit): a kill would then lose some.
            srv = start_server(data, owner, "--audit-batch-window", "0.3s")
            s = make_stubs(srv.address)
            if not sid:
                sid = s.sessions.CreateSession(
                    S.CreateSessionRequest(session_id="killed", shell=ALL)
                ).session.session_id
            stop = threading.Event()
            workers = [
                threading.Thread(target=_load, args=(s, sid, f"r{round_no}-w{w}", stop, answered))
                for w in range(6)
            ]
            for w in workers:
                w.start()
            time.sleep(rng.uniform(1.0, 3.0))
            srv.stop(9)  # SIGKILL at a random point under load
            stop.set()
            for w in workers:
                w.join()
            s.channel.close()
        assert len(answered) > 10

        srv = start_server(data, owner)
        s = make_stubs(srv.address)
        recorded = {
            e.attributes["path"] for e in _all_events(s, session_id=sid, kinds=["file_write"])
        }
        missing = [p for p in answered if p not in recorded]
        assert not missing, f"{len(missing)} answered call(s) without an event: {missing[:5]}"
        s.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
        s.channel.close()
        srv.stop()
    finally:
        remove_owned_containers(owner)


def test_sandboxctl_audit_lists_and_filters(au: Stubs, audit_server: ServerProcess) -> None:
    import os
    import subprocess
    import sys

    sid = au.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        au.processes.Run(P.RunRequest(session_id=sid, argv=["echo", "audited"]))
    finally:
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    ctl = Path(sys.executable).parent / "sandboxctl"
    env = {**os.environ, "SANDBOXD_ADDR": audit_server.address}

    def run_ctl(*args: str) -> str:
        done = subprocess.run([str(ctl), *args], capture_output=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    lines = run_ctl("-o", "json", "audit", "--session", sid, "--since", "10m")
    events = [json.loads(line) for line in lines.splitlines()]
    assert [e["kind"] for e in events] == ["lifecycle", "command", "lifecycle"]
    assert json.loads(events[1]["attributes"]["argv"]) == ["echo", "audited"]
    text = run_ctl("audit", "--session", sid, "--kind", "command")
    assert text.splitlines()[0].split() == ["TIME", "TENANT", "SESSION", "KIND", "DETAILS"]
    assert len(text.splitlines()) == 2 and "exit_code=0" in text
    assert run_ctl("-o", "json", "audit", "--session", sid, "--until", "1h").strip() == ""


def test_archives_and_snapshots_are_recorded_with_sizes_and_digests(au: Stubs) -> None:
    import hashlib
    import io
    import tarfile

    from sandboxd.v1 import snapshot_pb2, snapshot_pb2_grpc

    snaps = snapshot_pb2_grpc.SnapshotServiceStub(au.channel)
    sid = au.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("in.txt")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
        tar_bytes = buf.getvalue()

        def upload() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
            yield snapshot_pb2.ImportArchiveRequest(
                header=snapshot_pb2.ImportArchiveHeader(session_id=sid, path="")
            )
            yield snapshot_pb2.ImportArchiveRequest(data=tar_bytes)

        snaps.ImportArchive(upload())
        exported = b"".join(
            r.chunk.data
            for r in snaps.ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=sid))
        )
        snap = snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=sid)).snapshot

        by_kind = {e.kind: e.attributes for e in _all_events(au, session_id=sid)}
        imported = by_kind["archive_import"]
        assert imported["sha256"] == hashlib.sha256(tar_bytes).hexdigest()
        assert imported["tar_bytes"] == str(len(tar_bytes)) and imported["files"] == "1"
        out = by_kind["archive_export"]
        assert out["sha256"] == hashlib.sha256(exported).hexdigest()
        assert out["tar_bytes"] == str(len(exported))
        taken = by_kind["snapshot"]
        assert (taken["snapshot_id"], taken["sha256"]) == (snap.snapshot_id, snap.sha256)
        assert taken["size_bytes"] == str(snap.size_bytes)
    finally:
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_streamed_writes_moves_and_process_input_are_recorded_before_the_call_answers(
    au: Stubs,
) -> None:
    """Calls that changed state unrecorded before: each answered call's record is there at
    once, from the domain's event, with the call's method and trace id."""
    traced = (("traceparent", TRACEPARENT),)
    sid = au.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:

        def stream() -> Iterator[F.WriteFileStreamRequest]:
            yield F.WriteFileStreamRequest(
                header=F.WriteFileStreamHeader(session_id=sid, path="up.bin")
            )
            yield F.WriteFileStreamRequest(data=b"x" * 1000)
            yield F.WriteFileStreamRequest(data=b"y" * 24)

        au.files.WriteFileStream(stream(), metadata=traced)
        au.files.Move(
            F.MoveRequest(session_id=sid, source_path="up.bin", destination_path="moved.bin"),
            metadata=traced,
        )
        proc = au.processes.StartProcess(
            P.StartProcessRequest(session_id=sid, argv=["cat"], keep_stdin_open=True)
        ).process
        au.processes.SendProcessInput(
            P.SendProcessInputRequest(session_id=sid, process_id=proc.process_id, data=b"hi\n")
        )
        au.processes.CloseProcessStdin(
            P.CloseProcessStdinRequest(session_id=sid, process_id=proc.process_id)
        )
        writes = _all_events(au, session_id=sid, kinds=["file_write"])
        streamed, moved = writes[-2:]
        assert streamed.attributes["method"] == "FilesystemService/WriteFileStream"
        assert streamed.attributes["path"] == "up.bin"
        assert streamed.attributes["bytes"] == "1024" and streamed.attributes["size"] == "1024"
        assert streamed.trace_id == TRACE
        assert moved.attributes["method"] == "FilesystemService/Move"
        assert moved.attributes["action"] == "move"
        assert (moved.attributes["source"], moved.attributes["path"]) == ("up.bin", "moved.bin")
        actions = [
            (e.attributes.get("action"), e.attributes.get("method"))
            for e in _all_events(au, session_id=sid, kinds=["lifecycle"])
        ]
        assert ("send_process_input", "ProcessService/SendProcessInput") in actions
        assert ("close_process_stdin", "ProcessService/CloseProcessStdin") in actions
    finally:
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_commands_are_recorded_where_they_run_once_each(au: Stubs) -> None:
    """An Exec's record is its call's, with the bytes it wrote and the directory it ran in (as
    resolved); a StartProcess retried with its request_id started nothing more: one record."""
    sid = au.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        au.files.MakeDir(F.MakeDirRequest(session_id=sid, path="sub"))
        replies = list(
            au.processes.Exec(P.ExecRequest(session_id=sid, argv=["echo", "hi"], cwd="./sub/"))
        )
        assert replies[-1].WhichOneof("event") == "exited"
        start = P.StartProcessRequest(session_id=sid, argv=["sleep", "30"], request_id="once")
        first = au.processes.StartProcess(start).process
        again = au.processes.StartProcess(start).process
        assert again.process_id == first.process_id
        commands = _all_events(au, session_id=sid, kinds=["command"])
        ran = [e for e in commands if e.attributes["method"] == "ProcessService/Exec"]
        assert [(e.attributes["cwd"], e.attributes["output_bytes"]) for e in ran] == [
            ("/workspace/sub", "3")
        ]
        started = [
            e for e in commands if e.attributes.get("method") == "ProcessService/StartProcess"
        ]
        assert len(started) == 1
        assert started[0].attributes["request_id"] == "once"
        assert started[0].attributes["process_id"] == first.process_id
    finally:
        au.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
