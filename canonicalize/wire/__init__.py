"""One :class:`Exchange` per wire API, and the registry that routes to them.

An exchange knows where things live in its API's request (system text, tools[],
the history the hash chain covers), how to ask a streaming upstream for usage,
how its errors look, and which reply state machine reads its responses.  The
pipeline, the proxy's routes, metrics, audit and replay all go through
:func:`match` and this protocol, never through ``if api == ...``: adding a wire
API is one new module here plus one line in :data:`EXCHANGES`.

A :class:`Slot` is a string value rules may rewrite: the parsed container and
key it sits at (rules read and write it there) and its :data:`Path` in the raw
JSON (where the edit is spliced).
"""

from __future__ import annotations

from canonicalize.wire.base import Exchange, Reply, Slot
from canonicalize.wire.chat import CHAT
from canonicalize.wire.messages import MESSAGES
from canonicalize.wire.responses import RESPONSES

EXCHANGES: tuple[Exchange, ...] = (CHAT, MESSAGES, RESPONSES)


def match(path: str) -> Exchange | None:
    """The exchange serving ``path`` (a request path, no query), if any."""
    for exchange in EXCHANGES:
        if exchange.matches(path):
            return exchange
    return None


__all__ = ["CHAT", "EXCHANGES", "MESSAGES", "RESPONSES", "Exchange", "Reply", "Slot", "match"]
