"""Per-session CPU, memory, workspace and egress gauges on the real metrics endpoint, with the
cap on labelled sessions: the oldest session has series, the one past the cap is counted, and a
deleted session's series are gone at the next sampling."""

from __future__ import annotations

import re
import secrets
import urllib.request
from pathlib import Path

from conftest import ServerProcess, make_stubs, remove_owned_containers, start_server, wait_until
from sandboxd.v1 import common_pb2, filesystem_pb2, session_pb2

_METRICS_RE = re.compile(r"metrics served at http://(\S+):(\d+)/metrics")
_SERIES_RE = re.compile(r'^(sandboxd_session_\w+)\{session="([^"]+)",tenant="[^"]*"\} (\S+)$', re.M)


def _series(server: ServerProcess) -> dict[tuple[str, str], float]:
    found = _METRICS_RE.search(server.log())
    assert found, server.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{found.group(2)}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {(m[1], m[2]): float(m[3]) for m in _SERIES_RE.finditer(text)}
    omitted = re.search(r"^sandboxd_session_series_omitted (\S+)$", text, re.M)
    out[("omitted", "")] = float(omitted.group(1)) if omitted else -1.0
    return out


def test_per_session_gauges_are_capped_and_follow_the_sessions(tmp_path: Path) -> None:
    owner = "sm" + secrets.token_hex(3)
    server = start_server(
        tmp_path / "data",
        owner,
        "--metrics-session-limit",
        "1",
        "--metrics-session-interval-s",
        "1",
    )
    try:
        stubs = make_stubs(server.address)
        shell = common_pb2.ShellPolicy(allow=["true"])
        first, second = (
            stubs.sessions.CreateSession(
                session_pb2.CreateSessionRequest(shell=shell), timeout=60
            ).session.session_id
            for _ in range(2)
        )
        stubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=first, path="f", content=b"x" * 200_000),
            timeout=30,
        )

        def first_is_sampled() -> bool:
            s = _series(server)
            return (
                s.get(("sandboxd_session_workspace_bytes", first), 0) >= 200_000
                and s.get(("sandboxd_session_memory_bytes", first), 0) > 0
                and ("sandboxd_session_cpu_seconds", first) in s
                and ("sandboxd_session_egress_bytes", first) in s
                and s[("omitted", "")] == 1
            )

        assert wait_until(first_is_sampled, timeout=60), _series(server)
        assert not [k for k in _series(server) if k[1] == second], "past the cap: no series"

        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=first))

        def second_took_its_place() -> bool:
            s = _series(server)
            return ("sandboxd_session_cpu_seconds", second) in s and not [
                k for k in s if k[1] == first
            ]

        assert wait_until(second_took_its_place, timeout=60), _series(server)
        stubs.channel.close()
    finally:
        server.stop()
        remove_owned_containers(owner)
