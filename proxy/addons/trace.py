"""``trace.path``: each finished request handed to the recorder (proxy.recording) as
one trace line: what the client sent, what prefixpin decided, what the upstream
reported; a request refused before its body was read (:func:`rejected`) leaves a
line without a body.  A counting hook: it runs off the request's path, and all it does
there is queue the line (its head encoded, the body referenced: the writer thread
writes it)."""

from __future__ import annotations

import time

from starlette.types import Scope

from canonicalize import Canonicalized
from proxy.flow import Flow, Parsed, Skip, Tenant
from proxy.recording import Entry, Recorder


class Trace:
    name = "trace"
    needs = (Skip, Tenant, Parsed, Canonicalized)
    when = "counted"  # off the request's path (proxy.addons.counting)

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def done(self, flow: Flow) -> None:
        inbound, answer, outcome = flow.inbound, flow.answer, flow.outcome
        usage = answer.reply.usage if answer.reply is not None else None
        parsed = flow.get(Parsed)
        self.recorder.put(
            Entry(
                t=time.time() - (time.perf_counter() - inbound.started),  # when the request came in
                path=inbound.path,
                query=inbound.query,
                headers=inbound.headers.raw,
                body=inbound.raw,
                parsed=parsed is not None,
                flat=parsed is not None and parsed.doc.flat is True and parsed.doc.raw is inbound.raw,
                tenant=flow.tenant if flow.get(Skip) is None else None,
                lineage=outcome.record.id if outcome is not None else None,
                role=flow.role,
                status=answer.status,
                usage=usage.result if usage is not None else None,
                completion=usage.completion if usage is not None else 0,
                response=answer.message if answer.status < 400 else None,
            )
        )


def rejected(recorder: Recorder, scope: Scope, status: int) -> None:
    """A request prefixpin refused before reading its body (413: over
    ``limits.max_body_bytes``; 503: at ``limits.max_concurrency``): its line, with the
    headers as every line has them and no body (``prefixpin audit`` skips it, saying
    why)."""
    recorder.put(
        Entry(
            t=time.time(),
            path=scope["path"],
            query=scope.get("query_string", b""),
            headers=scope["headers"],
            body=b"",
            parsed=False,
            flat=False,
            tenant=None,
            lineage=None,
            role="rejected",
            status=status,
            usage=None,
            completion=0,
            response=None,
        )
    )
