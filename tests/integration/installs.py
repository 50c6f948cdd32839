"""Shared by the install tests: a server started from an installed command (not this checkout's
`python -m sandboxd`), and the first steps any install must answer: a built-in image built on
first start, a session, a command."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from conftest import REPO, ServerProcess, make_stubs
from sandboxd.v1 import common_pb2, process_pb2, session_pb2, template_pb2, template_pb2_grpc

_LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")


def serve(
    argv: Sequence[str], owner_id: str, data_dir: Path, *, cwd: Path, env: Mapping[str, str]
) -> ServerProcess:
    """Start `argv` and wait for its "listening on" line (the port it took)."""
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=dict(env),
    )
    server = ServerProcess(proc, data_dir, owner_id)
    found = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.log_lines.append(line)
            m = _LISTEN_RE.search(line)
            if m and not found.is_set():
                server.port = int(m.group(2))
                found.set()
        found.set()

    server.reader = threading.Thread(target=reader, daemon=True)
    server.reader.start()
    if not found.wait(120) or not server.port:
        server.stop()
        raise RuntimeError("the installed server did not start:\n" + server.log())
    return server


def first_session(address: str, *, ready_within_s: float = 300) -> bytes:
    """Wait for the default template's image (built on first start), then run `echo` in a
    session: what the install answers."""
    stubs = make_stubs(address)
    try:
        tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
        deadline = time.monotonic() + ready_within_s
        while True:
            t = tpl.GetTemplate(template_pb2.GetTemplateRequest(name="busybox"), timeout=10)
            if t.template.state == template_pb2.TEMPLATE_STATE_READY:
                break
            assert t.template.state != template_pb2.TEMPLATE_STATE_FAILED, t.template.message
            assert time.monotonic() < deadline, "the runtime image was never built"
            time.sleep(0.5)
        session = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow=["echo"])),
            timeout=60,
        ).session
        out = stubs.processes.Run(
            process_pb2.RunRequest(session_id=session.session_id, argv=["echo", "installed"]),
            timeout=30,
        )
        return out.stdout
    finally:
        stubs.channel.close()


def outside_repo(path: Path) -> bool:
    return REPO not in path.resolve().parents
