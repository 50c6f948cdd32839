"""`sbx dial PORT` (helper/dial.c) on the host, against local TCP servers: the byte stream
previews relay through. Both directions flow at once, each half-closes on its own, and a
port nobody listens on is a structured error."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest


def _serve(handler: Callable[[socket.socket], None]) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def accept() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                handler(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    thread.join(10)


def _echo_until_eof(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.sendall(b"bye")  # after the client's half-close: the other direction still flows


@pytest.fixture
def echo_port() -> Iterator[int]:
    yield from _serve(_echo_until_eof)


def test_relays_both_ways_and_half_closes(sbx: str, echo_port: int) -> None:
    cp = subprocess.run(
        [sbx, "dial", str(echo_port)], input=b"hello", capture_output=True, timeout=10
    )
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == b"hellobye"


def test_large_echo_does_not_deadlock(sbx: str, echo_port: int) -> None:
    """Megabytes through an echo server: with one blocking loop, the helper would wait on a
    full socket while the server waits on a full stdout; each direction has its own buffer."""
    payload = bytes(range(256)) * 16384  # 4 MiB
    with subprocess.Popen(
        [sbx, "dial", str(echo_port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None

        def feed() -> None:
            assert proc.stdin is not None
            proc.stdin.write(payload)
            proc.stdin.close()

        writer = threading.Thread(target=feed)
        writer.start()
        got = proc.stdout.read()
        writer.join(10)
        assert proc.wait(10) == 0
    assert got == payload + b"bye"


def test_server_closing_first_ends_stdout(sbx: str) -> None:
    def greet_and_close(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhi")

    for port in _serve(greet_and_close):
        with subprocess.Popen(
            [sbx, "dial", str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.read() == b"HTTP/1.0 200 OK\r\n\r\nhi"  # EOF, stdin still open
            proc.stdin.close()
            assert proc.wait(10) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening_is_refused(sbx: str) -> None:
    cp = subprocess.run([sbx, "dial", str(_free_port())], capture_output=True, timeout=10)
    assert cp.returncode == 1
    assert cp.stdout == b""
    assert json.loads(cp.stderr.decode().splitlines()[-1])["error"] == "ECONNREFUSED"


@pytest.mark.parametrize("args", [[], ["0"], ["65536"], ["80x"], [""], ["-1"], ["80", "81"]])
def test_bad_ports_are_refused(sbx: str, args: list[str]) -> None:
    cp = subprocess.run([sbx, "dial", *args], capture_output=True, timeout=10)
    assert cp.returncode != 0
    assert json.loads(cp.stderr.decode().splitlines()[-1])["error"] == "EINVAL"
