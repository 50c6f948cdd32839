"""sandboxctl's one-line byte counter for `cp`."""

from __future__ import annotations

import time
from typing import IO


class Progress:
    """A one-line byte counter on stderr with rate and time left, redrawn at most ten times a
    second. Each redraw clears the rest of the line, so a shorter line leaves nothing behind."""

    def __init__(self, label: str, total: int | None, stream: IO[str], enabled: bool) -> None:
        self.label, self.total, self.stream, self.enabled = label, total, stream, enabled
        self.done = 0
        self._started = time.monotonic()
        self._last = 0.0

    def add(self, n: int) -> None:
        self.to(self.done + n)

    def to(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.1:
            self._last = now
            self._draw()

    def finish(self) -> None:
        if self.enabled:
            if self.total:
                self.total = max(self.total, self.done)  # an estimate ends at what was sent
                self.done = self.total
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = self.done / elapsed
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            left = (self.total - self.done) / rate if rate > 0 else 0.0
            text = (
                f"{self.label} [{bar:<30}] {size(self.done)}/{size(self.total)} "
                f"{size(int(rate))}/s ETA {_clock(max(left, 0.0))}"
            )
        else:
            text = f"{self.label} {size(self.done)} {size(int(rate))}/s"
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()


def _clock(seconds: float) -> str:
    whole = int(seconds + 0.5)
    return f"{whole // 60}:{whole % 60:02d}"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover
