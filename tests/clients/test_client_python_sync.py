"""The synchronous Python client (sandboxd_client.sync) against a real server: the same calls,
results and errors as the asyncio client, in a script and inside a running event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import ServerProcess
from sandboxd_client import Exited, FileInfo, Output, RunResult, ServerInfo, errors
from sandboxd_client.sync import SandboxClient, Session


def test_hello_sandbox_without_asyncio(server: ServerProcess) -> None:
    with SandboxClient(server.address, timeout=60) as client:
        assert isinstance(client.server_info(), ServerInfo)
        with client.create_session(allow=["sh", "cat"], labels={"suite": "sync"}) as session:
            assert isinstance(session, Session) and session.id
            ran = session.run(["sh", "-c", "echo hi; exit 3"])
            assert isinstance(ran, RunResult) and (ran.exit_code, ran.stdout) == (3, b"hi\n")
            events = list(session.exec(["sh", "-c", "echo a; echo b >&2"]))
            assert b"".join(e.data for e in events if isinstance(e, Output)) == b"a\nb\n"
            assert isinstance(events[-1], Exited) and events[-1].exit_code == 0
            assert isinstance(session.write_file("notes.txt", b"hello"), FileInfo)
            assert session.read_file("notes.txt") == b"hello"
            listed = list(client.list_sessions({"suite": "sync"}))
            assert [s.id for s in listed] == [session.id]
            # Any other method of the asyncio Session is there by the same name.
            assert session.stat("notes.txt").size == 5
            with session.interact(["cat"]) as proc:
                proc.send(b"typed\n")
                proc.close_stdin()
                out = b"".join(e.data for e in proc if isinstance(e, Output))
            assert out == b"typed\n"
            sid = session.id
        # The block deleted it; the error is the asyncio client's class.
        with pytest.raises(errors.SessionNotFound):
            client.get_session(sid)


def test_leaving_an_iteration_early_ends_the_command(server: ServerProcess) -> None:
    with SandboxClient(server.address, timeout=60) as client:
        with client.create_session(allow_all=True) as session:
            for event in session.exec(["sh", "-c", "echo first; exec sleep 605"]):
                if isinstance(event, Output):
                    break
            deadline = time.monotonic() + 10
            while b"sleep 605" in session.run(["ps", "-o", "args"]).stdout:
                assert time.monotonic() < deadline, "the command outlived the loop it was read by"
                time.sleep(0.1)


def test_inside_a_running_event_loop_as_in_a_notebook(server: ServerProcess) -> None:
    async def cell() -> bytes:
        with SandboxClient(server.address, timeout=60) as client:
            with client.create_session(allow=["echo"]) as session:
                return session.run(["echo", "from a notebook"]).stdout

    assert asyncio.run(cell()) == b"from a notebook\n"


def test_calls_from_several_threads(server: ServerProcess) -> None:
    with SandboxClient(server.address, timeout=60) as client:
        with client.create_session(allow=["echo"]) as session:
            results: list[bytes] = []

            def call(n: int) -> None:
                results.append(session.run(["echo", str(n)]).stdout)

            threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == sorted(f"{n}\n".encode() for n in range(8))
