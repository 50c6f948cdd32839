"""An independent codec of the agent channel (docs/agent.md), for tests only.

Written from the document, not from the server's service/sandboxd/agent/ package: the two
implementations check each other. `AgentProcess` runs `sbx agent` over pipes (outside a PID
namespace it is a child subreaper, which is all the unit tests need) and reads its frames with a
timeout.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HELPER_SOURCES = sorted(str(p) for p in (REPO / "helper").glob("*.c"))
STATIC_FLAGS = ["-static", "-O2", "-Wall", "-Wextra", "-Werror"]
# As `make helper-asan` builds build/sbx-asan.
ASAN_FLAGS = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
]
SANITIZER_MARKS = ("AddressSanitizer", "runtime error:", "LeakSanitizer", "UndefinedBehavior")
ASAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:exitcode=99",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

MAX_PAYLOAD = 65536
SYNC = b"\xff\xff\xff\xffSANDBOXDSYNC"

HELLO, HELLO_OK, PING, PONG, GOAWAY = 0x01, 0x02, 0x03, 0x04, 0x05
OPEN, OPEN_OK, DATA, EOF, WINDOW, EXIT, RESET, SIGNAL, RESIZE, CLOSE = range(0x10, 0x1A)
NAMES = {
    HELLO: "HELLO",
    HELLO_OK: "HELLO_OK",
    PING: "PING",
    PONG: "PONG",
    GOAWAY: "GOAWAY",
    OPEN: "OPEN",
    OPEN_OK: "OPEN_OK",
    DATA: "DATA",
    EOF: "EOF",
    WINDOW: "WINDOW",
    EXIT: "EXIT",
    RESET: "RESET",
    SIGNAL: "SIGNAL",
    RESIZE: "RESIZE",
    CLOSE: "CLOSE",
}


@dataclass(frozen=True)
class Frame:
    type: int
    stream: int
    payload: bytes

    def json(self) -> Any:
        return json.loads(self.payload)

    @property
    def fd(self) -> int:
        return self.payload[0]

    @property
    def data(self) -> bytes:
        return self.payload[1:]

    def __repr__(self) -> str:
        name = NAMES.get(self.type, hex(self.type))
        return f"Frame({name}, {self.stream}, {self.payload[:80]!r})"


def encode(ftype: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", len(payload), ftype, stream) + payload


def encode_json(ftype: int, stream: int, obj: object) -> bytes:
    return encode(ftype, stream, json.dumps(obj).encode())


def data(stream: int, payload: bytes, fd: int = 0) -> bytes:
    return encode(DATA, stream, bytes([fd]) + payload)


def window(stream: int, increment: int) -> bytes:
    return encode(WINDOW, stream, struct.pack(">I", increment))


def build_helper(out: Path, asan: bool) -> str | None:
    """The helper from helper/*.c at `out`: a copy of what `make helper` / `make helper-asan`
    built when it is newer than every source, else compiled; the compiler's complaint when it
    cannot be."""
    built = REPO / "build" / ("sbx-asan" if asan else "sbx")
    sources = [Path(p) for p in HELPER_SOURCES] + list((REPO / "helper").glob("*.h"))
    if built.exists() and built.stat().st_mtime > max(p.stat().st_mtime for p in sources):
        shutil.copy2(built, out)
        return None
    flags = ASAN_FLAGS if asan else STATIC_FLAGS
    cp = subprocess.run(
        ["gcc", *flags, "-o", str(out), *HELPER_SOURCES],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if cp.returncode == 0 else cp.stderr.strip()[:500]


class Decoder:
    """Splits the agent's byte stream into frames; a bad length is an error (the agent never
    writes one, and completes a frame it began even when an epoch ends)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> list[Frame]:
        self.buf += chunk
        out: list[Frame] = []
        while len(self.buf) >= 9:
            length, ftype, stream = struct.unpack(">IBI", self.buf[:9])
            if length > MAX_PAYLOAD:
                raise ValueError(f"agent wrote a frame of length {length}")
            if len(self.buf) < 9 + length:
                break
            out.append(Frame(ftype, stream, bytes(self.buf[9 : 9 + length])))
            del self.buf[: 9 + length]
        return out


class AgentProcess:
    """`sbx agent` on pipes, with a workspace root of the test's own."""

    def __init__(
        self,
        binary: Path,
        root: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.proc = subprocess.Popen(
            [str(binary), "--root", str(root), "agent", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env if env is not None else {"PATH": "/usr/bin:/bin"},
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.out_fd = self.proc.stdout.fileno()
        os.set_blocking(self.out_fd, False)
        self.decoder = Decoder()
        self.pending: list[Frame] = []
        self.nonce = 0
        self.next_id = 1

    def send(self, raw: bytes) -> None:
        self.stdin.write(raw)
        self.stdin.flush()

    def hello(self, retry: float = 0.5, timeout: float = 10, **fields: object) -> Frame:
        """SYNC + HELLO, resent every `retry` seconds as the server does, until the HELLO_OK
        with this nonce (what precedes it is dropped)."""
        self.nonce += 1
        nonce = f"{self.nonce:016x}"
        body = {"version": 1, "nonce": nonce, "window": 262144, "keepalive_ms": 60000}
        body.update(fields)
        self.next_id = 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.send(SYNC + encode_json(HELLO, 0, body))
            resend = time.monotonic() + retry
            while time.monotonic() < resend:
                try:
                    f = self.read(timeout=max(0.01, resend - time.monotonic()))
                except TimeoutError:
                    break
                if f.type == HELLO_OK and _nonce_of(f) == nonce:
                    self.pending.clear()
                    return f
        raise TimeoutError("no HELLO_OK from the agent")

    def open_id(self) -> int:
        sid = self.next_id
        self.next_id += 2
        return sid

    def open(self, kind: str, **fields: object) -> int:
        sid = self.open_id()
        self.send(encode_json(OPEN, sid, {"kind": kind, **fields}))
        return sid

    def _fill(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.out_fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.out_fd, 1 << 20)
        if not chunk:
            raise EOFError("the agent closed its output")
        self.pending += self.decoder.feed(chunk)
        return True

    def read(self, timeout: float = 10) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self._fill(left):
                raise TimeoutError("no frame from the agent")
        return self.pending.pop(0)

    def read_until(self, pred: Any, timeout: float = 10) -> list[Frame]:
        """Frames up to and including the first that satisfies pred."""
        got: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            f = self.read(max(0.01, deadline - time.monotonic()))
            got.append(f)
            if pred(f):
                return got

    def quiet(self, seconds: float) -> list[Frame]:
        """Everything the agent sends within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._fill(max(0.0, deadline - time.monotonic()))
        got, self.pending = self.pending, []
        return got

    def stream_frames(self, sid: int, timeout: float = 10) -> list[Frame]:
        """Every frame of stream `sid` until it ends (EXIT, RESET or CLOSE), refilling its
        window as it goes; frames of other streams stay pending."""
        got: list[Frame] = []
        others: list[Frame] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                f = self.read(max(0.01, deadline - time.monotonic()))
                if f.stream != sid:
                    others.append(f)
                    continue
                got.append(f)
                if f.type == DATA:
                    self.send(window(sid, len(f.payload) - 1))
                if f.type in (EXIT, RESET, CLOSE):
                    return got
        finally:
            self.pending[:0] = others

    def close(self) -> int:
        """Closes the agent's input (outside a PID namespace it then ends what it runs and
        exits); its stderr is kept in `stderr_text`. Idempotent."""
        if self.proc.stderr is None or self.proc.stderr.closed:
            return self.proc.wait()
        try:
            self.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None and self.proc.stderr is not None
            self.stderr_text = self.proc.stderr.read().decode(errors="replace")
            self.proc.stdout.close()
            self.proc.stderr.close()


def _nonce_of(f: Frame) -> object:
    try:
        return json.loads(f.payload).get("nonce")
    except ValueError:
        return None


def output(frames: list[Frame], fd: int = 1) -> bytes:
    return b"".join(f.data for f in frames if f.type == DATA and f.fd == fd)


def exit_of(frames: list[Frame]) -> dict[str, Any]:
    last = frames[-1]
    assert last.type == EXIT, frames
    result: dict[str, Any] = last.json()
    return result
