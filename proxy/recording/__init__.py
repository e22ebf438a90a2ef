"""Recording live traffic as a trace ``prefixpin audit`` reads (SPEC section 2h).

line.py     one request as one trace line, credentials removed (the body as sent)
file.py     the file: whole lines appended under a lock shared by every process,
            rotation by size
writer.py   the bounded queue the event loop puts entries in, and the thread that
            writes them; every line not written is counted, no request fails

The addon that hands each finished request over is :mod:`proxy.addons.trace`.
"""

from __future__ import annotations

import logging

from proxy.config import Config
from proxy.metrics import Metrics
from proxy.recording.file import AppendError, TraceFile
from proxy.recording.line import CREDENTIAL_HEADERS, Encoder, Entry
from proxy.recording.writer import Recorder

log = logging.getLogger("prefixpin")


def open_recorder(config: Config, metrics: Metrics) -> Recorder | None:
    """The recorder ``trace.path`` asks for, its thread started; None: no trace."""
    t = config.trace
    if t.path is None:
        return None
    stage = metrics.fail_open.labels("trace")
    file = TraceFile(t.path, t.max_bytes, t.keep)
    try:
        file.open()
        log.info("recording every request to %s (trace.path)", file.path)
    except OSError as exc:  # served anyway: each line not written is counted
        log.warning("trace %s cannot be opened (%s): requests are served, their lines not recorded", t.path, exc)
    recorder = Recorder(
        file,
        Encoder(config.tenancy.credential_headers, config.tenancy.credential_params),
        lambda n: stage.inc(n),
    )
    recorder.start()
    return recorder


__all__ = ["CREDENTIAL_HEADERS", "AppendError", "Encoder", "Entry", "Recorder", "TraceFile", "open_recorder"]
