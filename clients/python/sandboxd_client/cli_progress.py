"""sandboxctl's one-line byte counter for `cp`."""

from __future__ import annotations

import time
from typing import IO


class Progress:
    """A one-line byte counter on stderr, redrawn at most ten times a second."""

    def __init__(self, label: str, total: int | None, stream: IO[str], enabled: bool) -> None:
        self.label, self.total, self.stream, self.enabled = label, total, stream, enabled
        self.done = 0
        self._last = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.1:
            self._last = now
            self._draw()

    def finish(self) -> None:
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {size(self.done)}/{size(self.total)}"
        else:
            text = f"{self.label} {size(self.done)}"
        self.stream.write("\r" + text)
        self.stream.flush()


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover
