"""What a process holds in memory (Linux ``/proc``), for tests that bound it: its
resident size now, and the peak since the last reset."""

from __future__ import annotations

import contextlib
from pathlib import Path

MiB = 1 << 20


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise KeyError(field)


def rss(pid: int) -> int:
    """Resident bytes now."""
    return _status(pid, "VmRSS")


def peak(pid: int) -> int:
    """The most resident bytes since the process started or :func:`reset_peak`."""
    return _status(pid, "VmHWM")


def reset_peak(pid: int) -> None:
    """Start the peak afresh from now (``clear_refs`` 5, Linux 4.0+; the peak then
    counts from the process's start where that is not allowed)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


class Watch:
    """The growth of ``pid``'s peak resident size from now: ``with Watch(pid) as w: ...;
    w.growth``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = 0
        self.growth = 0

    def __enter__(self) -> Watch:
        self.before = rss(self.pid)
        reset_peak(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.growth = peak(self.pid) - self.before
        print(f"peak resident memory grew by {self.growth / MiB:.1f} MiB")  # shown by pytest -rP (docs/deploy.md)


__all__ = ["MiB", "Watch", "peak", "reset_peak", "rss"]
