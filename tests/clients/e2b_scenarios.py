"""Scenarios written against the official `e2b` SDK only, as an E2B user writes them: run by
the SDK's own virtualenv (build/e2b-venv, `make e2b-sdk`), never by the suite's, with
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at sandboxd's E2B door.

    python e2b_scenarios.py NAME      exit 0 when the scenario held, else the traceback

tests/clients/test_e2b_sdk.py runs each one against a live server.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import PtySize
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

TEMPLATE = "base"


def create_run() -> None:
    sbx = Sandbox.create(
        TEMPLATE, metadata={"suite": "e2b", "run": os.environ["RUN"]}, envs={"FOO": "bar"}
    )
    try:
        out: list[str] = []
        err: list[str] = []
        r = sbx.commands.run(
            "echo hello $FOO; echo oops >&2; pwd; echo $HOME",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        assert r.exit_code == 0, r
        assert r.stdout == "hello bar\n/home/user\n/home/user\n", repr(r.stdout)
        assert r.stderr == "oops\n", repr(r.stderr)
        assert "".join(out) == r.stdout and "".join(err) == r.stderr
        assert sbx.commands.run("python3 -c 'print(6*7)'").stdout == "42\n"
        assert sbx.commands.run("echo $X", envs={"X": "per-command"}).stdout == "per-command\n"
        try:
            sbx.commands.run("echo before; exit 3")
            raise AssertionError("a non-zero exit must raise")
        except CommandExitException as exc:
            assert exc.exit_code == 3 and exc.stdout == "before\n", exc
        started = time.monotonic()
        try:
            sbx.commands.run("sleep 30", timeout=1)
            raise AssertionError("a command past its timeout must raise")
        except TimeoutException:
            assert time.monotonic() - started < 20
        info = sbx.get_info()
        assert info.metadata == {"suite": "e2b", "run": os.environ["RUN"]}, info
        assert info.template_id == TEMPLATE and info.state.value == "running", info
        before = info.end_at
        sbx.set_timeout(600)
        assert sbx.get_info().end_at > before
        listed = Sandbox.list(query=_query({"run": os.environ["RUN"]})).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id], listed
        assert Sandbox.list(query=_query({"run": "nobody"})).next_items() == []
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("cat /proc/self/status | grep -c '^Uid:'").stdout == "1\n"
        assert sbx.is_running()
    finally:
        sbx.kill()
    assert not sbx.is_running()
    try:
        Sandbox.get_info(sbx.sandbox_id)
        raise AssertionError("a killed sandbox must be gone")
    except NotFoundException:
        pass


def _query(metadata: dict[str, str]) -> object:
    from e2b import SandboxQuery

    return SandboxQuery(metadata=metadata)


def background() -> None:
    with Sandbox.create(TEMPLATE) as sbx:
        h = sbx.commands.run("cat; echo done-$?", background=True, stdin=True)
        assert any(p.pid == h.pid for p in sbx.commands.list()), sbx.commands.list()
        sbx.commands.send_stdin(h.pid, "line one\n")
        joined = sbx.commands.connect(h.pid)
        sbx.commands.send_stdin(h.pid, "line two\n")
        sbx.commands.close_stdin(h.pid)
        r = h.wait()
        assert r.stdout == "line one\nline two\ndone-0\n", repr(r.stdout)
        assert joined.wait().exit_code == 0
        sleeper = sbx.commands.run("sleep 300", background=True)
        assert sbx.commands.kill(sleeper.pid)
        try:
            sleeper.wait()
            raise AssertionError("a killed command must not exit 0")
        except CommandExitException as exc:
            assert exc.exit_code != 0
        assert all(p.pid != sleeper.pid for p in sbx.commands.list())


def pty() -> None:
    with Sandbox.create(TEMPLATE) as sbx:
        seen = bytearray()
        h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        sbx.pty.send_stdin(h.pid, b"stty size; echo $((6*7))x\n")
        events = iter(h)
        while b"42x" not in seen:
            _, _, data = next(events)
            seen.extend(data or b"")
        sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(h.pid, b"stty size; exit\n")
        for _, _, data in events:
            seen.extend(data or b"")
        text = seen.decode(errors="replace")
        assert "24 80" in text and "42x" in text and "30 100" in text, text
        assert h.wait().exit_code == 0
        h2 = sbx.pty.create(PtySize(rows=24, cols=80))
        assert sbx.pty.kill(h2.pid)


def files() -> None:
    with Sandbox.create(TEMPLATE) as sbx:
        fs = sbx.files
        info = fs.write("notes/a.txt", "hello")
        assert info.path == "/home/user/notes/a.txt", info
        assert fs.read("/home/user/notes/a.txt") == "hello"
        assert fs.read("notes/a.txt", format="bytes") == bytearray(b"hello")
        fs.write("/home/user/bin.dat", b"\x00\xff" * 70000)
        assert bytes(fs.read("bin.dat", format="bytes")) == b"\x00\xff" * 70000
        names = sorted(e.name for e in fs.list("/home/user"))
        assert names == ["bin.dat", "notes"], names
        assert fs.exists("notes/a.txt") and not fs.exists("notes/none.txt")
        moved = fs.rename("notes/a.txt", "notes/b.txt")
        assert moved.path == "/home/user/notes/b.txt", moved
        assert fs.make_dir("deep/er/dir") is True
        assert fs.make_dir("deep/er/dir") is False  # already there
        assert fs.get_info("deep").type.value == "dir"
        fs.remove("notes")
        assert not fs.exists("notes/b.txt")
        assert sbx.commands.run("ls /home/user").stdout == "bin.dat\ndeep\n"
        handle = fs.watch_dir("/home/user/deep")
        fs.write("deep/new.txt", "x")
        events = []
        for _ in range(50):
            events += handle.get_new_events()
            if any(e.name == "new.txt" for e in events):
                break
            time.sleep(0.1)
        handle.stop()
        assert any(
            e.name == "new.txt"
            and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE)
            for e in events
        ), events
        try:
            fs.read("missing.txt")
            raise AssertionError("reading a missing file must raise")
        except NotFoundException:
            pass


def async_sdk() -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(TEMPLATE, metadata={"flavour": "async"})
        try:
            r = await sbx.commands.run("echo async; exit 0")
            assert r.stdout == "async\n", r
            await sbx.files.write("x.txt", "y")
            assert await sbx.files.read("x.txt") == "y"
            events: list[object] = []
            handle = await sbx.files.watch_dir("/home/user", on_event=events.append)
            await sbx.files.write("watched.txt", "z")
            for _ in range(50):
                if any(getattr(e, "name", "") == "watched.txt" for e in events):
                    break
                await asyncio.sleep(0.1)
            await handle.stop()
            assert any(getattr(e, "name", "") == "watched.txt" for e in events), events
            try:
                await sbx.commands.run("exit 7")
                raise AssertionError("a non-zero exit must raise")
            except CommandExitException as exc:
                assert exc.exit_code == 7
        finally:
            await sbx.kill()

    asyncio.run(main())


def refusals() -> None:
    """Bad input through this door gets a clear error of the class the SDK branches on."""
    try:
        Sandbox.create(TEMPLATE, api_key="not-a-key-of-anyone")
        raise AssertionError("a wrong API key must be refused")
    except AuthenticationException:
        pass
    try:
        Sandbox.connect("i0000000000000000000")
        raise AssertionError("an unknown sandbox must be not found")
    except NotFoundException:
        pass
    with Sandbox.create(TEMPLATE) as sbx:
        try:
            sbx.files.read("/etc/passwd")
            raise AssertionError("a path outside the home must be refused")
        except SandboxException as exc:
            assert "outside" in str(exc), exc
        try:
            sbx.files.write("../escape.txt", "x")
            raise AssertionError("'..' must be refused")
        except SandboxException as exc:
            assert "outside" in str(exc) or ".." in str(exc), exc
        try:
            sbx.commands.run("id", user="root")
            raise AssertionError("root must be refused")
        except SandboxException as exc:
            assert "root" in str(exc), exc
        other = os.environ.get("E2B_OTHER_API_KEY")
        if other:
            try:
                Sandbox.connect(sbx.sandbox_id, api_key=other)
                raise AssertionError("another tenant's sandbox must be not found")
            except NotFoundException:
                pass
            try:
                Sandbox.kill(sbx.sandbox_id, api_key=other)
            except NotFoundException:
                pass
            assert sbx.is_running()
        assert sbx.commands.run("echo still-here").stdout == "still-here\n"


def pause_resume() -> None:
    """A filesystem pause: the files are kept, the sandbox is listed as paused, a connect
    resumes it; a second pause of a paused sandbox is answered as E2B answers (False)."""
    sbx = Sandbox.create(TEMPLATE)
    try:
        sbx.files.write("kept.txt", "across a pause")
        assert sbx.pause() is True
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
        assert Sandbox.pause(sbx.sandbox_id) is False  # already paused: 409
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.get_info().state.value == "running"
        assert resumed.files.read("kept.txt") == "across a pause"
        assert resumed.commands.run("cat kept.txt").stdout == "across a pause"
    finally:
        sbx.kill()


def bench_true() -> None:
    """`commands.run("true")` N times on one sandbox; prints the seconds of each."""
    n = int(os.environ.get("N", "20"))
    with Sandbox.create(TEMPLATE) as sbx:
        sbx.commands.run("true")
        for _ in range(n):
            t0 = time.perf_counter()
            sbx.commands.run("true")
            print(time.perf_counter() - t0)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    # Every check of the scenario passed. The async SDK's process then aborts now and then in
    # the interpreter's own finalization ("Fatal Python error: Aborted", no Python frame: a
    # native thread of the SDK's dependencies), after its sandbox is already deleted; that is
    # the client library's exit, not the door's answer, so the scenario ends without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
