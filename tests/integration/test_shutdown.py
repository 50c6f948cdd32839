"""SIGTERM drains: health turns NOT_SERVING, calls in flight finish, new calls are refused, and
the process exits 0 within the grace period; what outlasts the grace is cut off."""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import ServerProcess, make_stubs, remove_owned_containers, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

GRACE_S = 5.0
MARGIN_S = 5.0


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of its own: this test stops it."""
    owner = "drain" + secrets.token_hex(3)
    server = start_server(tmp_path, owner, "--shutdown-grace-s", f"{GRACE_S:g}s")
    try:
        yield server
    finally:
        server.stop()
        remove_owned_containers(owner)


def _session(address: str) -> str:
    stubs = make_stubs(address)
    try:
        return stubs.sessions.CreateSession(  # type: ignore[no-any-return]
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
    finally:
        stubs.channel.close()


def test_sigterm_drains_in_flight_calls(own_server: ServerProcess) -> None:
    sid = _session(own_server.address)
    stubs = make_stubs(own_server.address)
    try:
        # A health watch opened before the signal sees the drain begin.
        watch = health_pb2_grpc.HealthStub(stubs.channel).Watch(
            health_pb2.HealthCheckRequest(service="sandboxd.v1.ProcessService"), timeout=30
        )
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING

        # A Run in flight, and an Exec whose start we can see.
        ran: list[object] = []
        runner = threading.Thread(
            target=lambda: ran.append(
                stubs.processes.Run(
                    process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", "sleep 2; echo ran"]),
                    timeout=30,
                )
            )
        )
        runner.start()
        events = stubs.processes.Exec(
            process_pb2.ExecRequest(session_id=sid, argv=["sh", "-c", "sleep 2; echo done"]),
            timeout=30,
        )
        assert next(events).WhichOneof("event") == "started"
        time.sleep(0.2)  # the Run has been accepted too by now

        signalled = time.monotonic()
        own_server.proc.send_signal(signal.SIGTERM)

        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # a watch never ends by itself; it must not hold the drain

        # New calls are refused while the old ones finish: on a new connection and on the
        # one already open. (A moment first: health turns before the server stops accepting.)
        time.sleep(0.3)
        fresh = make_stubs(own_server.address)
        try:
            for channel_stubs in (fresh, stubs):
                with pytest.raises(grpc.RpcError) as excinfo:
                    channel_stubs.sessions.GetSession(
                        session_pb2.GetSessionRequest(session_id=sid), timeout=5
                    )
                assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        finally:
            fresh.channel.close()

        rest = list(events)
        assert [e.WhichOneof("event") for e in rest] == ["output", "exited"]
        assert rest[0].output.data == b"done\n"
        assert rest[1].exited.exit_code == 0
        runner.join(30)
        assert len(ran) == 1 and isinstance(ran[0], process_pb2.RunResponse), ran
        assert ran[0].stdout == b"ran\n" and ran[0].exit_code == 0

        code = own_server.proc.wait(GRACE_S + MARGIN_S)
        took = time.monotonic() - signalled
        assert code == 0, own_server.log()
        assert 1.5 < took < GRACE_S + MARGIN_S, f"exited {took:.1f} s after SIGTERM"
        assert "Traceback" not in own_server.log(), own_server.log()
    finally:
        stubs.channel.close()


def test_grace_period_cuts_off_long_calls(tmp_path: Path) -> None:
    owner = "cutoff" + secrets.token_hex(3)
    server = start_server(tmp_path, owner, "--shutdown-grace-s", "1s")
    stubs = make_stubs(server.address)
    try:
        sid = _session(server.address)
        events = stubs.processes.Exec(
            process_pb2.ExecRequest(session_id=sid, argv=["sleep", "60"]), timeout=60
        )
        assert next(events).WhichOneof("event") == "started"
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError):
            list(events)
        assert server.proc.wait(1 + MARGIN_S) == 0, server.log()
        assert time.monotonic() - signalled < 1 + MARGIN_S
    finally:
        stubs.channel.close()
        server.stop()
        remove_owned_containers(owner)


def test_second_signal_forces_exit(tmp_path: Path) -> None:
    owner = "force" + secrets.token_hex(3)
    server = start_server(tmp_path, owner, "--shutdown-grace-s", "60s")
    stubs = make_stubs(server.address)
    try:
        sid = _session(server.address)
        events = stubs.processes.Exec(
            process_pb2.ExecRequest(session_id=sid, argv=["sleep", "60"]), timeout=60
        )
        assert next(events).WhichOneof("event") == "started"
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.proc.poll() is None, "the first signal must wait for the call"
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(MARGIN_S) == 0, server.log()
        assert time.monotonic() - signalled < MARGIN_S
        with pytest.raises(grpc.RpcError):
            list(events)
    finally:
        stubs.channel.close()
        server.stop()
        remove_owned_containers(owner)
