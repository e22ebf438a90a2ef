"""``trace.path``: each finished request handed to the recorder (proxy.recording) as
one trace line: what the client sent, what prefixpin decided, what the upstream
reported.  A counting hook: it runs off the next request's path, and all it does
there is queue the line (its head encoded, the body referenced: the writer thread
writes it)."""

from __future__ import annotations

import time

from proxy.flow import Flow
from proxy.recording import Entry, Recorder


class Trace:
    name = "trace"
    counts_only = True  # may run a little later (proxy.addons.Runner.done)

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def done(self, flow: Flow) -> None:
        reply, outcome = flow.reply, flow.outcome
        usage = reply.usage if reply is not None else None
        self.recorder.put(
            Entry(
                t=time.time() - (time.perf_counter() - flow.started),  # when the request came in
                path=flow.path,
                query=flow.query,
                headers=flow.headers.raw,
                body=flow.raw,
                parsed=flow.body is not None,
                tenant=flow.tenant if not flow.skip else None,
                lineage=outcome.record.id if outcome is not None else None,
                role=flow.role,
                status=flow.status,
                usage=usage.result if usage is not None else None,
                completion=usage.completion if usage is not None else 0,
                response=flow.message if flow.status < 400 else None,
            )
        )
