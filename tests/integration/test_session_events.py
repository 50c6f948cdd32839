"""Session events against a real server: a lease warning before expiry, process start/exit,
reconnecting with a sequence number, and tenant scoping of WatchSessions."""

from __future__ import annotations

import queue
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
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, events_pb2, process_pb2, session_pb2

E, P, S = events_pb2, process_pb2, session_pb2
ALL = common_pb2.ShellPolicy(allow_all=True)


def _kind(e: events_pb2.SessionEvent) -> str:
    return E.SessionEventKind.Name(e.kind).removeprefix("SESSION_EVENT_KIND_")


class Watch:
    """A watch stream read by a thread into a queue, so a test can wait for one event."""

    def __init__(self, call: grpc.Future) -> None:
        self.call = call
        self.events: queue.Queue[events_pb2.SessionEvent | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for resp in self.call:
                self.events.put(resp.event)
        except grpc.RpcError as exc:
            self.events.put(exc)

    def next(self, timeout: float = 20) -> events_pb2.SessionEvent:
        item = self.events.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def until(self, kind: str, timeout: float = 20) -> events_pb2.SessionEvent:
        deadline = time.monotonic() + timeout
        while True:
            e = self.next(max(0.1, deadline - time.monotonic()))
            if _kind(e) == kind:
                return e

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(5)


@pytest.fixture(scope="module")
def ev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "evt" + secrets.token_hex(4)
    with own_server(
        tmp_path_factory.mktemp("events") / "data", owner, "--events-lease-warning", "3s"
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def ev(ev_server: ServerProcess) -> Iterator[Stubs]:
    s = make_stubs(ev_server.address)
    yield s
    s.channel.close()


def test_lease_warning_arrives_before_expiry_then_the_expiry(ev: Stubs) -> None:
    sid = ev.sessions.CreateSession(
        S.CreateSessionRequest(shell=ALL, lease_ttl=duration_pb2.Duration(seconds=6))
    ).session.session_id
    watch = Watch(ev.sessions.WatchSession(E.WatchSessionRequest(session_id=sid)))
    try:
        created = watch.until("STATE_CHANGED")
        assert created.session_id == sid
        warning = watch.until("LEASE_EXPIRING")
        expires_at = ev.sessions.GetSession(S.GetSessionRequest(session_id=sid)).session
        left = expires_at.lease_expires_at.ToDatetime().timestamp() - time.time()
        assert left > 0, "the warning came after the lease ended"
        assert 0 < float(warning.attributes["expires_in_s"]) <= 3.5
        expired = watch.until("STATE_CHANGED")
        assert expired.state == "SESSION_STATE_EXPIRED"
        assert expired.sequence > warning.sequence
    finally:
        watch.close()
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_process_events_and_reconnecting_with_a_sequence(ev: Stubs) -> None:
    sid = ev.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        watch = Watch(ev.sessions.WatchSession(E.WatchSessionRequest(session_id=sid)))
        first = watch.until("STATE_CHANGED")
        for _ in ev.processes.Exec(P.ExecRequest(session_id=sid, argv=["sh", "-c", "exit 4"])):
            pass
        started = watch.until("PROCESS_STARTED")
        exited = watch.until("PROCESS_EXITED")
        assert exited.attributes["exit_code"] == "4"
        assert exited.attributes["process_id"] == started.attributes["process_id"]
        watch.close()

        # Missed while disconnected: replayed after the last sequence seen, then live.
        ev.sessions.RenewLease(S.RenewLeaseRequest(session_id=sid))
        ev.processes.Run(P.RunRequest(session_id=sid, argv=["true"]))
        again = Watch(
            ev.sessions.WatchSession(
                E.WatchSessionRequest(session_id=sid, after_sequence=exited.sequence)
            )
        )
        renewed = again.next()
        assert _kind(renewed) == "LEASE_RENEWED" and renewed.sequence > exited.sequence
        assert _kind(again.next()) == "PROCESS_EXITED"
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
        gone = again.until("STATE_CHANGED")
        assert gone.attributes["deleted"] == "true"
        with pytest.raises(queue.Empty):  # the stream ended with the session
            item = again.events.get(timeout=2)
            if isinstance(item, BaseException):
                raise queue.Empty from item
        again.close()

        # A sequence from before the kept window is a clear marker, not a silent gap.
        lost = Watch(ev.sessions.WatchSessions(E.WatchSessionsRequest(after_sequence=1)))
        assert _kind(lost.next()) == "EVENTS_LOST"
        lost.close()
        assert first.sequence > 1
    finally:
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_bad_watch_requests(ev: Stubs) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        next(iter(ev.sessions.WatchSession(E.WatchSessionRequest(session_id="no-such"))))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as negative:
        next(iter(ev.sessions.WatchSessions(E.WatchSessionsRequest(after_sequence=-1))))
    assert error_info(negative.value).reason == "INVALID_SEQUENCE"


TOKENS = {"a-" + secrets.token_urlsafe(16): "alpha", "b-" + secrets.token_urlsafe(16): "beta"}
TOKEN_OF = {tenant: token for token, tenant in TOKENS.items()}


def test_watch_sessions_sees_only_the_callers_tenant_and_labels(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", TOKENS)
    owner = "evn" + secrets.token_hex(4)
    srv = start_server(tmp_path / "data", owner, "--tokens-file", str(tokens))
    alpha, beta = (authed_stubs(srv.address, TOKEN_OF[t]) for t in ("alpha", "beta"))
    try:
        beta_all = Watch(beta.sessions.WatchSessions(E.WatchSessionsRequest()))
        alpha_team = Watch(
            alpha.sessions.WatchSessions(E.WatchSessionsRequest(label_selector={"team": "x"}))
        )
        time.sleep(0.5)  # both streams are open
        alpha.sessions.CreateSession(
            S.CreateSessionRequest(session_id="alpha.other", shell=ALL, labels={"team": "y"})
        )
        alpha.sessions.CreateSession(
            S.CreateSessionRequest(session_id="alpha.mine", shell=ALL, labels={"team": "x"})
        )
        beta.sessions.CreateSession(S.CreateSessionRequest(session_id="beta.one", shell=ALL))
        with pytest.raises(grpc.RpcError) as theirs:  # nor may beta watch alpha's session
            next(iter(beta.sessions.WatchSession(E.WatchSessionRequest(session_id="alpha.mine"))))
        assert theirs.value.code() == grpc.StatusCode.NOT_FOUND

        seen_alpha = {alpha_team.until("STATE_CHANGED").session_id for _ in range(2)}
        assert seen_alpha == {"alpha.mine"}
        seen_beta = {beta_all.until("STATE_CHANGED").session_id for _ in range(2)}
        assert seen_beta == {"beta.one"}
        beta_all.close()
        alpha_team.close()
        for s, sid in ((alpha, "alpha.other"), (alpha, "alpha.mine"), (beta, "beta.one")):
            s.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    finally:
        for s in (alpha, beta):
            s.channel.close()
        srv.stop()
        remove_owned_containers(owner)


def test_stats_and_an_oom_kill_event(ev: Stubs) -> None:
    sid = ev.sessions.CreateSession(
        S.CreateSessionRequest(
            shell=ALL,
            limits=common_pb2.ResourceLimits(memory_bytes=64 * 1024 * 1024),
        )
    ).session.session_id
    watch = Watch(ev.sessions.WatchSession(E.WatchSessionRequest(session_id=sid)))
    try:
        ev.processes.Run(
            P.RunRequest(session_id=sid, argv=["sh", "-c", "head -c 3000000 /dev/zero > big"])
        )
        stats = ev.sessions.GetSessionStats(E.GetSessionStatsRequest(session_id=sid)).stats
        assert stats.workspace_bytes >= 3_000_000
        assert stats.memory_bytes > 0 and stats.processes >= 1 and stats.cpu_seconds > 0
        # A command that allocates past the memory limit: the kernel kills it, the feed says so.
        hog = ev.processes.Run(
            P.RunRequest(
                session_id=sid,
                argv=["sh", "-c", "x=a; while true; do x=$x$x$x$x; done"],
                timeout=duration_pb2.Duration(seconds=60),
            )
        )
        assert hog.exit_code == 137 and not hog.timed_out, hog
        oom = watch.until("OOM_KILLED", timeout=30)
        assert oom.attributes["memory_limit_bytes"] == str(64 * 1024 * 1024)
        after = ev.sessions.GetSessionStats(E.GetSessionStatsRequest(session_id=sid)).stats
        assert after.memory_peak_bytes == 0 or after.memory_peak_bytes > 32 * 1024 * 1024
    finally:
        watch.close()
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    with pytest.raises(grpc.RpcError) as gone:
        ev.sessions.GetSessionStats(E.GetSessionStatsRequest(session_id=sid))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_sandboxctl_watch_prints_events(ev: Stubs, ev_server: ServerProcess) -> None:
    import json as json_
    import os
    import subprocess
    import sys

    sid = ev.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        ctl = Path(sys.executable).parent / "sandboxctl"
        env = {**os.environ, "SANDBOXD_ADDR": ev_server.address}
        done = subprocess.run(
            [str(ctl), "-o", "json", "watch", sid, "--count", "2"],
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode()
        lines = [json_.loads(line) for line in done.stdout.decode().splitlines()]
        assert [e["kind"] for e in lines] == ["STATE_CHANGED", "STATE_CHANGED"]
        assert [e["state"] for e in lines] == ["CREATING", "RUNNING"]
        text = subprocess.run(
            [str(ctl), "watch", "--after", str(lines[0]["sequence"]), "--count", "1"],
            capture_output=True,
            env=env,
            timeout=60,
        ).stdout.decode()
        assert text.split()[0] == str(lines[1]["sequence"]) and "RUNNING" in text
    finally:
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_a_background_process_exit_is_an_event_and_audited(ev: Stubs) -> None:
    from sandboxd.v1 import audit_pb2, audit_pb2_grpc

    sid = ev.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    watch = Watch(ev.sessions.WatchSession(E.WatchSessionRequest(session_id=sid)))
    try:
        ev.processes.StartProcess(
            P.StartProcessRequest(session_id=sid, process_id="bg", argv=["sh", "-c", "exit 5"])
        )
        assert watch.until("PROCESS_STARTED").attributes["process_id"] == "bg"
        exited = watch.until("PROCESS_EXITED")
        assert (exited.attributes["process_id"], exited.attributes["exit_code"]) == ("bg", "5")
        audit = audit_pb2_grpc.AuditServiceStub(ev.channel)
        commands = audit.ListAuditEvents(
            audit_pb2.ListAuditEventsRequest(session_id=sid, kinds=["command"])
        ).events
        # In the order each was committed: an exit at once may be recorded before the
        # StartProcess call's own event (README, "Audit log").
        codes = [e.attributes.get("exit_code") for e in commands]
        assert sorted(codes, key=str) == ["5", None], codes
        assert all(e.attributes["background"] == "true" for e in commands)
    finally:
        watch.close()
        ev.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
