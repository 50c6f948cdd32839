"""sandboxctl, the installed entry point, against a real server."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
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
        assert info["session_id"] == sid and info["state"] == "RUNNING"
        server_info = json.loads(ctl(server, "info").stdout)
        assert server_info["version"]
    finally:
        removed = ctl(server, "rm", sid)
    assert removed.returncode == 0 and removed.stdout.decode().strip() == sid


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
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
    assert missing.returncode == 125
    assert missing.stderr.decode().startswith("sandboxctl: SESSION_NOT_FOUND: ")

    sid = ctl(server, "create", "--allow", "echo").stdout.decode().strip()
    try:
        denied = ctl(server, "exec", sid, "--", "rm", "-rf", "/workspace")
        assert denied.returncode == 125
        assert "COMMAND_NOT_ALLOWED" in denied.stderr.decode()
    finally:
        ctl(server, "rm", sid)

    bad = ctl(server, "create", "--user", "0:0")
    assert bad.returncode == 125 and "INVALID_USER" in bad.stderr.decode()

    down = subprocess.run(
        [str(SANDBOXCTL), "--addr", "127.0.0.1:1", "--call-timeout", "5", "ls"],
        capture_output=True,
        timeout=60,
    )
    assert down.returncode == 125 and "UNAVAILABLE" in down.stderr.decode()


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
        assert missing.returncode == 125 and missing.stderr.startswith(b"sandboxctl: ")
        assert b": " in missing.stderr.split(b"sandboxctl: ", 1)[1]
    finally:
        ctl(server, "rm", sid)


def _ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_background_processes_and_snapshots(server: ServerProcess, tmp_path: Path) -> None:
    sid = _ok(ctl(server, "create", "--allow-all")).strip()
    try:
        pid = _ok(ctl(server, "start", sid, "--id", "web", "--", "sh", "-c", "echo up; sleep 60"))
        assert pid.strip() == "web"
        ps = json.loads(_ok(ctl(server, "-o", "json", "ps", sid)))
        assert [(p["process_id"], p["state"]) for p in ps] == [("web", "RUNNING")]
        assert "web" in _ok(ctl(server, "ps", sid)).splitlines()[1]

        # attach replays from the start; kill ends it; attach's exit code is the process's
        _ok(ctl(server, "kill", sid, "web", "--signal", "SIGKILL"))
        attached = ctl(server, "attach", sid, "web")
        assert attached.stdout == b"up\n" and attached.returncode == 128 + 9, attached.stderr
        replay = ctl(server, "-o", "json", "attach", sid, "web", "--stdout-offset", "1")
        assert replay.returncode == 128 + 9
        events = [json.loads(line) for line in replay.stdout.decode().splitlines()]
        assert events[-1]["kind"] == "exited" and events[-1]["signal"] == "SIGKILL"
        assert any(e["kind"] == "output" and e["data"] == "p\n" for e in events)

        _ok(ctl(server, "exec", sid, "--", "sh", "-c", "echo v1 > state.txt"))
        snap = _ok(ctl(server, "snapshot", "create", sid, "--label", "step=1")).strip()
        listed = json.loads(_ok(ctl(server, "-o", "json", "snapshot", "ls", sid)))
        assert [s["snapshot_id"] for s in listed] == [snap] and listed[0]["kind"] == "TAR"
        got = json.loads(_ok(ctl(server, "-o", "json", "snapshot", "get", snap)))
        assert got["labels"] == {"step": "1"}
        tar_path = tmp_path / "snap.tar"
        _ok(ctl(server, "snapshot", "download", snap, str(tar_path)))
        assert tar_path.stat().st_size == got["size_bytes"]

        fork = _ok(ctl(server, "fork", snap, "--allow", "cat")).strip()
        try:
            assert ctl(server, "exec", fork, "--", "cat", "state.txt").stdout == b"v1\n"
        finally:
            _ok(ctl(server, "rm", fork))
        _ok(ctl(server, "snapshot", "rm", snap))
        gone = ctl(server, "-o", "json", "snapshot", "get", snap)
        assert gone.returncode == 125
        assert json.loads(gone.stderr)["error"]["reason"] == "SNAPSHOT_NOT_FOUND"
    finally:
        ctl(server, "rm", sid)


def test_every_command_speaks_json(server: ServerProcess) -> None:
    made = json.loads(_ok(ctl(server, "-o", "json", "create", "--allow", "sh")))
    sid = made["session_id"]
    try:
        assert made["state"] == "RUNNING"
        renewed = json.loads(_ok(ctl(server, "-o", "json", "renew", sid, "--ttl", "600")))
        assert renewed["lease_expires_at"].endswith("Z")
        info = json.loads(_ok(ctl(server, "-o", "json", "info")))
        assert info["api_version"] == "v1" and "snapshots" in info["features"]
        ran = ctl(server, "-o", "json", "exec", sid, "--", "sh", "-c", "echo hi; exit 3")
        kinds = [json.loads(line)["kind"] for line in ran.stdout.decode().splitlines()]
        assert kinds[0] == "started" and kinds[-1] == "exited" and ran.returncode == 3
        swept = json.loads(_ok(ctl(server, "-o", "json", "sweep")))
        assert set(swept) == {
            "expired_sessions",
            "removed_containers",
            "removed_networks",
            "removed_images",
        }
    finally:
        removed = json.loads(_ok(ctl(server, "-o", "json", "rm", sid)))
    assert removed == {"deleted": [sid]}


def test_shell_is_an_interactive_pty(server: ServerProcess) -> None:
    """sandboxctl on a real local terminal: raw mode, SIGWINCH resize, exit code through."""
    import fcntl
    import pty
    import select
    import signal
    import struct
    import termios

    sid = _ok(ctl(server, "create", "--allow-all")).strip()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 20, 70, 0, 0))
    proc = subprocess.Popen(
        [str(SANDBOXCTL), "shell", sid],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "SANDBOXD_ADDR": server.address},
        start_new_session=True,
    )
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, timeout: float = 30) -> None:
        nonlocal seen
        end = time.monotonic() + timeout
        while marker not in seen and time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert marker in seen, seen

    try:
        read_until(b"$ ")  # the shell flushes what was typed before its prompt
        os.write(master, b"stty size; echo M1\n")
        read_until(b"20 70")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
        os.kill(proc.pid, signal.SIGWINCH)
        time.sleep(0.5)
        os.write(master, b"stty size; exit 5\n")
        read_until(b"33 111")
        assert proc.wait(timeout=30) == 5
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        ctl(server, "rm", sid)


def _pty_run(server: ServerProcess, *args: str, script: bytes, marker: bytes) -> tuple[int, bytes]:
    """sandboxctl on a real terminal: wait for `marker`, type `script`, read to the end."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [str(SANDBOXCTL), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "SANDBOXD_ADDR": server.address},
        start_new_session=True,
    )
    os.close(slave)
    seen, typed = b"", False
    end = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
            if not typed and marker in seen:
                os.write(master, script)
                typed = True
        return proc.wait(timeout=30), seen
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_shell_new_outlasts_the_command_timeout_and_is_deleted_after(
    server: ServerProcess,
) -> None:
    """`shell` died at the session's command timeout (137, no message); `--new` is
    `docker run -it --rm`: a session of its own, gone when the shell exits."""
    label = "shellnew=" + secrets.token_hex(4)
    code, seen = _pty_run(
        server,
        "shell",
        "--new",
        "--command-timeout",
        "1",
        "--label",
        label,
        script=b"sleep 2.5; echo still-$((40+2)); exit 4\n",
        marker=b"$ ",
    )
    assert code == 4, seen
    assert b"still-42" in seen
    assert _ok(ctl(server, "ls", "--label", label)).count("\n") <= 1  # the header alone


def test_run_rm_and_run_that_keeps_its_session(server: ServerProcess) -> None:
    label = "runrm=" + secrets.token_hex(4)
    ran = ctl(
        server, "run", "--rm", "--allow-all", "--label", label, "--", "sh", "-c", "echo hi; exit 3"
    )
    assert (ran.returncode, ran.stdout) == (3, b"hi\n"), ran.stderr
    assert _ok(ctl(server, "ls", "--label", label)).count("\n") <= 1
    kept = ctl(server, "run", "--allow", "true", "--label", label, "--", "true")
    assert kept.returncode == 0 and b"kept (sandboxctl rm " in kept.stderr
    sid = kept.stderr.decode().split("session ", 1)[1].split()[0]
    assert sid in _ok(ctl(server, "ls", "--label", label))
    _ok(ctl(server, "rm", sid))


def test_create_takes_limit_flags(server: ServerProcess) -> None:
    made = json.loads(
        _ok(
            ctl(
                server,
                "-o",
                "json",
                "create",
                "--allow",
                "true",
                "--memory",
                "128Mi",
                "--command-timeout",
                "30",
                "--file-size",
                "2Mi",
                "--pids",
                "80",
                "--lease",
                "600",
            )
        )
    )
    try:
        limits = made["limits"]
        assert limits["memory_bytes"] == 128 << 20 and limits["file_bytes"] == 2 << 20
        assert limits["pids"] == 80 and limits["command_timeout"] == 30
    finally:
        ctl(server, "rm", made["session_id"])


def test_own_failures_exit_125_and_a_closed_pipe_is_quiet(server: ServerProcess) -> None:
    assert ctl(server, "no-such-command").returncode == 125
    assert ctl(server, "create", "--memory", "lots").returncode == 125
    version = ctl(server, "--version")
    assert version.returncode == 0 and version.stdout.startswith(b"sandboxctl ")
    sid = _ok(ctl(server, "create", "--allow-all")).strip()
    try:
        env = {**os.environ, "SANDBOXD_ADDR": server.address}
        piped = subprocess.run(
            f"{SANDBOXCTL} exec {sid} -- sh -c 'head -c 900000 /dev/zero | tr \\\\0 x' | head -c 5",
            shell=True,
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert piped.stdout == b"xxxxx"
        assert b"Traceback" not in piped.stderr and b"BrokenPipe" not in piped.stderr, piped.stderr
    finally:
        ctl(server, "rm", sid)


def test_completion_scripts(tmp_path: Path) -> None:
    bash = subprocess.run([str(SANDBOXCTL), "completion", "bash"], capture_output=True, check=True)
    script = tmp_path / "c.sh"
    script.write_bytes(bash.stdout)
    probe = (
        f"source {script}; COMP_WORDS=(sandboxctl snapshot c); COMP_CWORD=2; _sandboxctl; "
        'echo "${COMPREPLY[@]}"; COMP_WORDS=(sandboxctl exec x --c); COMP_CWORD=3; '
        '_sandboxctl; echo "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, check=True, text=True)
    assert done.stdout.splitlines() == ["create", "--cwd"]
    zsh = subprocess.run([str(SANDBOXCTL), "completion", "zsh"], capture_output=True, check=True)
    assert zsh.stdout.startswith(b"#compdef sandboxctl")
    fish = subprocess.run([str(SANDBOXCTL), "completion", "fish"], capture_output=True, check=True)
    assert b"complete -c sandboxctl -n 'test (__sandboxctl_path) = \"snapshot\"' -a 'create'" in (
        fish.stdout
    )


def test_a_closed_port_is_one_clear_line_not_a_trace() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [str(SANDBOXCTL), "--addr", "127.0.0.1:1", "--call-timeout", "5", "ls"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 10
    assert done.returncode == 125
    (line,) = done.stderr.splitlines()
    assert line.startswith("sandboxctl: UNAVAILABLE: cannot reach sandboxd at 127.0.0.1:1")


def test_network_policy_and_egress_log(server: ServerProcess) -> None:
    sid = _ok(ctl(server, "create", "--allow", "sh")).strip()
    try:
        assert json.loads(_ok(ctl(server, "-o", "json", "egress", sid))) == []
        assert _ok(ctl(server, "egress", sid)).split() == [
            "SEQ",
            "TIME",
            "VERDICT",
            "METHOD",
            "HOST",
            "PORT",
            "REASON",
            "UP",
            "DOWN",
        ]
        assert _ok(ctl(server, "network", sid)).strip() == "DENY"
        fixed = ctl(server, "network", sid, "--domain", "example.com", "--port", "443")
        assert fixed.returncode == 125
        assert fixed.stderr.startswith((b"sandboxctl: NETWORK_MODE_FIXED", b"sandboxctl: EGRESS_"))
    finally:
        ctl(server, "rm", sid)
    made = ctl(
        server, "-o", "json", "create", "--allow", "sh", "--domain", "example.com", "--port", "443"
    )
    if made.returncode == 0:
        session = json.loads(made.stdout)
        try:
            assert session["network"]["mode"] == "ALLOWLIST"
            assert session["network"]["allowed_domains"] == ["example.com"]
        finally:
            ctl(server, "rm", session["session_id"])
    else:
        assert json.loads(made.stderr)["error"]["reason"] == "EGRESS_UNAVAILABLE"


def test_create_with_an_isolation_tier(server: ServerProcess) -> None:
    made = ctl(server, "-o", "json", "create", "--allow", "echo", "--isolation", "runc")
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    try:
        assert info["isolation"] == "RUNC"
    finally:
        ctl(server, "rm", info["session_id"])
    bad = ctl(server, "create", "--isolation", "kvm")
    assert bad.returncode != 0 and b"invalid choice" in bad.stderr


def test_a_refused_cp_is_the_servers_reason_every_time(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A 48 MB file over the session's file cap is refused at its header while sandboxctl still
    streams the rest: the error is FILE_TOO_LARGE each time, never the transport's INTERNAL
    (which 2 of 4 tries printed before the client kept the server's status)."""
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        f.truncate(48 * 1024 * 1024)
    sid = ctl(server, "create", "--allow", "sh").stdout.decode().strip()
    try:
        for i in range(6):
            up = ctl(server, "cp", "--no-progress", str(big), f"{sid}:")
            assert up.returncode == 125, up.stderr
            assert up.stderr.decode().startswith("sandboxctl: FILE_TOO_LARGE: "), (i, up.stderr)
    finally:
        ctl(server, "rm", sid)
