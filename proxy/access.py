"""What a wire request's access-log line says besides the request line and status:
its role, lineage, the prompt and cached tokens the upstream reported, and the
cause of what was not cached, when there is one (``log.access: true``)::

    127.0.0.1:50312 - "POST /v1/chat/completions HTTP/1.1" 200 role=continuation
        lineage=5f0c2a61e9d4 prompt=22150 cached=2048 cause=system_changed

``cause`` is what ``prefixpin_uncached_tokens_total{cause}`` counted for the
request besides new content (a break's cause, ``evicted``, both joined by ``,``);
without usage, the break's cause.  Counts and names only: no prompt text, no
credential, no tenant.

The handler leaves the text in the request's scope (``scope["extensions"]
[ACCESS_NOTE]``) once the response is done; the server appends it to the line.
"""

from __future__ import annotations

import logging

from canonicalize import UNCACHED_CAUSES, split_uncached
from proxy.addons.measure import prediction
from proxy.flow import Flow
from proxy.front.server import ACCESS_NOTE, access_log

__all__ = ["ACCESS_NOTE", "enabled", "note"]
log = logging.getLogger("prefixpin")


def enabled() -> bool:
    return access_log.isEnabledFor(logging.INFO)


def note(flow: Flow) -> str:
    """The request's part of its access-log line (module docstring); never raises (a
    failure leaves out what it could not say)."""
    outcome = flow.outcome
    parts = [f"role={flow.role}", f"lineage={outcome.record.id if outcome is not None else '-'}"]
    try:
        return " ".join(parts + _tokens(flow))
    except Exception:
        log.exception("the access log's token counts failed")
        return " ".join(parts)


def _tokens(flow: Flow) -> list[str]:
    parts = []
    reply = flow.answer.reply
    usage = reply.usage.result if reply is not None else None
    p = prediction(flow)
    if usage is not None:
        parts += [f"prompt={usage.prompt}", f"cached={usage.cached}"]
        split = split_uncached(p, usage.prompt, usage.cached)
        causes = [c for c in UNCACHED_CAUSES if c != "new" and split.get(c)]
    else:
        causes = [p.cause] if p is not None and p.cause is not None else []
    if causes:
        parts.append(f"cause={','.join(causes)}")
    return parts
