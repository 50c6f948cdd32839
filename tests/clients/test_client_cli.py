"""sandboxctl, the installed entry point, against a real server."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from conftest import ServerProcess

SANDBOXCTL = Path(sys.executable).parent / "sandboxctl"


def ctl(
    server: ServerProcess, *args: str, stdin: bytes = b"", addr_flag: bool = False
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ}
    if addr_flag:
        env.pop("SANDBOXD_ADDR", None)
        args = ("--addr", server.address, *args)
    else:
        env["SANDBOXD_ADDR"] = server.address
    return subprocess.run(
        [str(SANDBOXCTL), *args], input=stdin, capture_output=True, env=env, timeout=120
    )


def test_create_ls_exec_info_rm(server: ServerProcess) -> None:
    owner = "cli-" + secrets.token_hex(4)
    made = ctl(server, "create", "--allow", "sh", "--allow", "cat", "--label", f"owner={owner}")
    assert made.returncode == 0, made.stderr
    sid = made.stdout.decode().strip()
    try:
        listed = ctl(server, "ls", "--label", f"owner={owner}", addr_flag=True)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.decode().splitlines()
        assert lines[0].split()[:2] == ["SESSION", "STATE"]
        assert [ln.split()[0] for ln in lines[1:]] == [sid]
        assert "RUNNING" in lines[1] and f"owner={owner}" in lines[1]

        as_json = json.loads(ctl(server, "ls", "--label", f"owner={owner}", "--json").stdout)
        assert [s["session_id"] for s in as_json] == [sid]

        # the remote exit code becomes sandboxctl's own; stdout and stderr stay apart
        ran = ctl(server, "exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
        assert (ran.returncode, ran.stdout, ran.stderr) == (7, b"out\n", b"err\n")

        piped = ctl(server, "exec", "-i", sid, "--", "cat", stdin=b"from stdin")
        assert (piped.returncode, piped.stdout) == (0, b"from stdin")

        info = json.loads(ctl(server, "info", sid).stdout)
        assert info["session_id"] == sid and info["state"] == "SESSION_STATE_RUNNING"
        server_info = json.loads(ctl(server, "info").stdout)
        assert server_info["version"]
    finally:
        removed = ctl(server, "rm", sid)
    assert removed.returncode == 0 and removed.stdout.decode().strip() == sid


def test_exec_output_is_live(server: ServerProcess) -> None:
    """The first line shows before the command ends."""
    sid = ctl(server, "create", "--allow-all").stdout.decode().strip()
    env = {**os.environ, "SANDBOXD_ADDR": server.address}
    try:
        with subprocess.Popen(
            [str(SANDBOXCTL), "exec", sid, "--", "sh", "-c", "echo first; sleep 3; echo second"],
            stdout=subprocess.PIPE,
            env=env,
        ) as proc:
            assert proc.stdout is not None
            start = time.monotonic()
            assert proc.stdout.readline() == b"first\n"
            assert time.monotonic() - start < 2.5
            assert proc.stdout.read() == b"second\n"
            assert proc.wait(30) == 0
    finally:
        ctl(server, "rm", sid)


def test_errors_exit_nonzero_with_the_servers_reason(server: ServerProcess) -> None:
    missing = ctl(server, "exec", "no-such-session", "--", "echo", "hi")
    assert missing.returncode == 1
    assert missing.stderr.decode().startswith("sandboxctl: SESSION_NOT_FOUND: ")

    sid = ctl(server, "create", "--allow", "echo").stdout.decode().strip()
    try:
        denied = ctl(server, "exec", sid, "--", "rm", "-rf", "/workspace")
        assert denied.returncode == 1
        assert "COMMAND_NOT_ALLOWED" in denied.stderr.decode()
    finally:
        ctl(server, "rm", sid)

    bad = ctl(server, "create", "--user", "0:0")
    assert bad.returncode == 1 and "INVALID_USER" in bad.stderr.decode()

    down = subprocess.run(
        [str(SANDBOXCTL), "--addr", "127.0.0.1:1", "--call-timeout", "5", "ls"],
        capture_output=True,
        timeout=60,
    )
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr.decode()


def test_cp_in_and_out_with_progress(server: ServerProcess, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.sh").write_text("echo hi\n")
    (src / "a.sh").chmod(0o755)
    payload = os.urandom(700_000)
    (src / "sub" / "blob.bin").write_bytes(payload)
    sid = ctl(server, "create", "--allow-all").stdout.decode().strip()
    try:
        up = ctl(server, "cp", "--progress", str(src), f"{sid}:")
        assert up.returncode == 0, up.stderr
        assert b"[##############################]" in up.stderr  # the bar, completed
        assert b"4 files, 700008 bytes" in up.stderr
        ran = ctl(server, "exec", sid, "--", "sh", "src/a.sh")
        assert ran.stdout == b"hi\n"

        # a new local path gets the folder's contents
        out = tmp_path / "out"
        down = ctl(server, "cp", "--progress", f"{sid}:src", str(out))
        assert down.returncode == 0, down.stderr
        assert (out / "sub" / "blob.bin").read_bytes() == payload
        assert (out / "a.sh").stat().st_mode & 0o777 == 0o755

        # an existing folder receives it under its own name
        dest = tmp_path / "dest"
        dest.mkdir()
        down = ctl(server, "cp", "--no-progress", f"{sid}:src/sub", str(dest))
        assert down.returncode == 0 and down.stderr == b""
        assert (dest / "sub" / "blob.bin").read_bytes() == payload

        missing = ctl(server, "cp", f"{sid}:nope", str(tmp_path / "x"))
        assert missing.returncode == 1 and missing.stderr.startswith(b"sandboxctl: ")
        assert b": " in missing.stderr.split(b"sandboxctl: ", 1)[1]
    finally:
        ctl(server, "rm", sid)
