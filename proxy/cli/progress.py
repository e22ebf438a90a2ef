"""A dependency-free progress bar on stderr for long CLI runs (audit, replay).

It draws only when stderr is a terminal (or ``force``), at most ~10 times a
second, and always leaves stdout clean for the report.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self, total: int | None, label: str, *, enabled: bool = True, force: bool = False, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.label = label
        self.done = 0
        self.enabled = enabled and (force or self.stream.isatty())
        self._last = 0.0
        self._start = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done == self.total):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self._start
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {elapsed:5.1f}s"
        else:
            text = f"\r{self.label} {self.done} {elapsed:5.1f}s"
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
