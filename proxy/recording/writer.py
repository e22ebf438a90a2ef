"""Recording off the request path: a bounded queue and one writer thread.

The event loop puts each request in the queue (:meth:`Recorder.put`: never blocks,
never raises), encoded as its line (:class:`~proxy.recording.line.Encoder`: a few
microseconds, the body not copied) when the proxy parsed its body, else as the
:class:`~proxy.recording.line.Entry` it is (checking or base64-encoding a body the
proxy did not parse is the thread's work).  A thread takes what the queue holds and
appends the lines to the file in one locked write
(:class:`~proxy.recording.file.TraceFile`), the GIL released while it writes: the
event loop and the thread do not take turns at the GIL over the encoding (both
use the encoder: it holds frozen sets and a dict of header names, each change to
it one dict operation under the GIL).

The event loop does not wake the thread: the thread looks at the queue every
:data:`POLL_S` (or as soon as :data:`BATCH_LINES` wait), so under load it takes the
GIL from the event loop ten times a second, not once per request, and each write
carries many lines.  A line reaches the file within ``POLL_S`` of its response's end.

Nothing here can fail a request.  A line that is not written (the queue is full,
the disk is, the file cannot be opened) is counted in
``prefixpin_fail_open_total{stage="trace"}`` and logged as a WARNING at most once
per :data:`WARN_EVERY_S`.  The queue holds at most ``max_lines`` entries and
``max_bytes`` of request bodies (:data:`MAX_LINES`, :data:`MAX_BYTES`): past
either, a new entry is dropped, not waited for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from proxy.recording.file import AppendError, Line, TraceFile
from proxy.recording.line import Encoder, Entry
from proxy.throttle import Throttle, more

log = logging.getLogger("prefixpin")
MAX_LINES = 4096  # entries waiting for the writer
MAX_BYTES = 64 << 20  # their bodies' bytes
WARN_EVERY_S = 10.0
_ENTRY_BYTES = 1024  # what an entry costs besides its body (headers, reply), roughly
BATCH_LINES = 256  # lines the writer takes at once (one write); as many waiting wake it
POLL_S = 0.1  # how often the writer looks at the queue


class Recorder:
    """Puts entries in the queue; the thread writes them (module docstring)."""

    def __init__(
        self,
        file: TraceFile,
        encoder: Encoder,
        lost: Callable[[int], None],
        *,
        max_lines: int = MAX_LINES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        """``lost(n)``: ``n`` lines were not written (the count goes to the metric)."""
        self.file = file
        self.encoder = encoder
        self._lost = lost
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._queue: deque[tuple[Entry | Line, int]] = deque()  # (entry or line, its bytes)
        self._bytes = 0
        self._lock = threading.Lock()  # put() takes it alone: a Condition's own `with` is Python code
        self._cond = threading.Condition(self._lock)
        self._closing = False
        self._busy = False  # the thread holds a batch it has not written yet
        self._warn = Throttle(WARN_EVERY_S)
        self._thread = threading.Thread(target=self._run, name="prefixpin-trace", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, entry: Entry) -> bool:
        """Queue ``entry`` (as its line when the proxy parsed its body); False (counted)
        when the queue is full or closed, or the line cannot be made."""
        size = len(entry.body) + _ENTRY_BYTES
        item: Entry | Line = entry
        if entry.parsed:
            try:
                item = self.encoder.encode(entry)
            except Exception as exc:  # a bug of ours: the request is served all the same
                log.exception("trace: a line could not be encoded")
                self.lost(1, f"{type(exc).__name__} while encoding")
                return False
        with self._lock:
            full = len(self._queue) >= self.max_lines or self._bytes + size > self.max_bytes
            if full or self._closing:
                dropped = True
            else:
                dropped = False
                self._queue.append((item, size))
                self._bytes += size
                if len(self._queue) == BATCH_LINES:  # a burst: no need to wait for the poll
                    self._cond.notify()
        if dropped:
            self.lost(1, "the queue of lines to write is full" if full else "recording has stopped")
        return not dropped

    def flush(self, timeout: float) -> bool:
        """Wait until every entry queued so far is written (or lost); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout``), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the trace writer did not finish within %.0f s; lines still queued are lost", timeout)
        else:
            self.file.close()

    def lost(self, n: int, why: str) -> None:
        """Count ``n`` lines not written; warn now and then."""
        self._lost(n)
        if self._warn.allow(time.monotonic()):
            log.warning(
                "trace %s: %d line(s) not recorded: %s (requests are served as usual)%s",
                self.file.path,
                n,
                why,
                more(self._warn.take_held(), "such losses"),
            )

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._busy:
                    self._busy = False
                    self._cond.notify_all()  # flush() waiters
                if not self._queue:
                    if self._closing:
                        return
                    self._cond.wait(POLL_S)  # close() and a burst cut it short
                    continue
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH_LINES))]
                self._bytes -= sum(size for _, size in batch)
                self._busy = True
            self._write([item for item, _ in batch])

    def _write(self, batch: list[Entry | Line]) -> None:
        lines: list[Line] = []
        for item in batch:
            if not isinstance(item, Entry):
                lines.append(item)
                continue
            try:
                lines.append(self.encoder.encode(item))
            except Exception as exc:  # a bug of ours must not stop the thread
                log.exception("trace: a line could not be encoded")
                self.lost(1, f"{type(exc).__name__} while encoding")
        if not lines:
            return
        try:
            self.file.append(lines)
        except AppendError as exc:
            self.lost(len(lines) - exc.written, exc.strerror or str(exc.cause))
        except OSError as exc:
            self.lost(len(lines), exc.strerror or str(exc))
        except Exception as exc:
            log.exception("trace: lines could not be written")
            self.lost(len(lines), type(exc).__name__)
