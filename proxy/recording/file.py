"""A trace file that any number of processes append whole lines to, rotated by size.

Several workers (``listen.workers``) record to one ``trace.path``.  ``O_APPEND``
alone does not keep their lines whole: a write may be cut short (a full disk, a
signal, a line bigger than what one call takes), and the rest, written by a second
call, can land after another process's line.  So each process appends under an
exclusive ``flock`` on the file, and while it holds it:

- it checks that its descriptor is still the file at ``path`` (another process may
  have rotated it) and opens it again when not;
- it ends a line a killed writer left without its newline (that one line is then
  malformed, and ``prefixpin audit`` names it; the next ones read);
- it rotates the file when the next line would take it past ``max_bytes``
  (``path`` -> ``path.1`` -> ... -> ``path.<keep>``, the oldest removed; with
  ``keep`` 0 the full file is removed), a line longer than ``max_bytes`` alone in
  a file;
- it writes its lines, all of them (a short write goes on where it stopped), or,
  when a write fails, cuts the file back to where its lines began, so a failed
  write leaves no partial line behind.

A process holds one lock at a time, except while rotating, when it takes the new
file's lock before it lets the old one's go: locks are taken in the order the files
were created, so no two processes wait on each other.

A path that is not a regular file (``/dev/full``, ``/dev/null``) is written to but
never rotated or cut.  The file is created with mode 0600: it holds prompts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Sequence
from pathlib import Path

Line = Sequence[bytes]  # one line's pieces; the last ends with b"\n"
REOPEN_TRIES = 1000  # times the file may be found replaced (each: another process rotated it) before giving up
_IOV_MAX = 1024  # pieces one writev() takes (Linux's IOV_MAX)


class AppendError(OSError):
    """Lines not written: ``written`` of them were, the rest were not."""

    def __init__(self, written: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.written = written
        self.cause = cause


class TraceFile:
    """``append`` whole lines to ``path``, rotating it at ``max_bytes`` (module docstring)."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, keep: int) -> None:
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.max_bytes = max_bytes
        self.keep = keep
        self._fd: int | None = None
        self._regular = True
        self._left = -1  # the file's size when this process last wrote to it (its last byte: a newline)

    def append(self, lines: Sequence[Line]) -> None:
        """Write ``lines`` at the end of the file, in order; :class:`AppendError` says
        how many were written when it fails (an :class:`OSError` before any was)."""
        fd, size = self._locked()
        written = 0
        try:
            size = self._end(fd, size)
            group: list[Line] = []
            grouped = 0
            for line in lines:
                n = sum(len(p) for p in line)
                if self._regular and size + grouped + n > self.max_bytes and size + grouped > 0:
                    self._write(fd, group, size)
                    written += len(group)
                    fd = self._rotate(fd)
                    size = self._end(fd, os.fstat(fd).st_size)
                    group, grouped = [], 0
                group.append(line)
                grouped += n
            self._write(fd, group, size)
            written += len(group)
            self._left = size + grouped
        except OSError as exc:
            raise AppendError(written, exc) from None
        finally:
            _unlock(fd)

    def open(self) -> None:
        """Open (create) the file now: a path that cannot be written is known at start."""
        if self._fd is None:
            self._fd = self._open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._left = -1

    # -- under the lock -----------------------------------------------------------------
    def _locked(self) -> tuple[int, int]:
        """The descriptor of the file now at ``path``, locked, and the file's size."""
        for _ in range(REOPEN_TRIES):
            if self._fd is None:
                self._fd = self._open()
            fd = self._fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not self._regular:
                return fd, 0
            mine = os.fstat(fd)
            if self._current(mine):
                return fd, mine.st_size
            _unlock(fd)  # rotated by another process: its new file
            self.close()
        raise OSError(f"{self.path} was replaced {REOPEN_TRIES} times while this process tried to append to it")

    def _open(self) -> int:
        flags = os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_RDWR, 0o600)  # reading: the last byte (_end)
        except PermissionError:
            fd = os.open(self.path, flags | os.O_WRONLY, 0o600)
        self._regular = stat.S_ISREG(os.fstat(fd).st_mode)
        return fd

    def _current(self, mine: os.stat_result) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def _end(self, fd: int, size: int) -> int:
        """The file's size, once a line a killed writer left open is ended (looked at
        only when another process wrote since this one did)."""
        if not self._regular or not size or size == self._left:
            return size
        try:
            last = os.pread(fd, 1, size - 1)
        except OSError:  # opened write-only
            return size
        if last != b"\n":
            self._write(fd, [[b"\n"]], size)
            size += 1
        return size

    def _write(self, fd: int, lines: Sequence[Line], size: int) -> None:
        """All of ``lines``; on a failure the file is cut back to ``size``."""
        pieces: list[bytes | memoryview] = [p for line in lines for p in line if p]
        at, n = 0, len(pieces)
        try:
            while at < n:
                done = os.writev(fd, pieces[at : at + _IOV_MAX])
                while at < n and done >= len(pieces[at]):  # the pieces written whole
                    done -= len(pieces[at])
                    at += 1
                if done:  # one written in part: its rest next
                    pieces[at] = memoryview(pieces[at])[done:]
        except OSError:
            if self._regular:
                with contextlib.suppress(OSError):  # else the next append ends the partial line (_end)
                    os.ftruncate(fd, size)
            raise

    def _rotate(self, fd: int) -> int:
        """Move the full file aside and lock a new one (``fd`` is still held: see the
        module docstring on lock order); the new file's descriptor, locked."""
        path = Path(self.path)
        if self.keep == 0:
            path.unlink(missing_ok=True)
        else:
            # The oldest removed first, so that no rename lands on an existing file: ext4
            # (auto_da_alloc) writes out a file renamed over another at once, on this thread.
            Path(f"{self.path}.{self.keep}").unlink(missing_ok=True)
            for i in range(self.keep - 1, 0, -1):
                older = Path(f"{self.path}.{i}")
                if older.exists():
                    os.replace(older, f"{self.path}.{i + 1}")
            os.replace(path, f"{self.path}.1")
        self._fd, self._left = self._open(), -1
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        _unlock(fd)
        os.close(fd)
        return self._fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):  # closed: the lock went with it
        fcntl.flock(fd, fcntl.LOCK_UN)
