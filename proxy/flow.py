"""One request on its way through prefixpin: what came in, what the addons
decided, what went out and what came back.

A :class:`Flow` is created by the handler once the body is read and handed to
every addon in order (see :mod:`proxy.addons`).  Addons write their decisions
here; nothing about a request lives anywhere else.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers

from canonicalize import Canonicalized, Exchange, JsonDoc, Lookup, Op, Outcome, Prepared, Reply
from proxy.cpu import is_big
from proxy.upstream.policy import NO_ROUTE, Route


def bypassed(headers: Headers) -> bool:
    """``x-prefixpin-bypass: 1``: the client asks for its request to go untouched."""
    return headers.get("x-prefixpin-bypass", "").strip() == "1"


@dataclass(slots=True)
class Flow:
    exchange: Exchange
    headers: Headers
    query: bytes  # the raw query string, as the client sent it
    raw: bytes  # the body as the client sent it
    started: float  # perf_counter() when the body was in
    path: str = ""  # the request target's path, as the client sent it (no query)
    body: dict[str, Any] | None = None  # its parse; None when it is not a JSON object
    doc: JsonDoc | None = None
    role: str = "root"  # x-prefixpin-role and the ``role`` label
    skip: bool = False  # bypass, or a body that is not ours to judge: forward untouched
    failed: bool = False  # an addon failed: forward what the client sent, edit nothing more
    tenant: str = ""
    prep: Prepared | None = None
    lookup: Lookup | None = None  # what the store found for the request's chain (its parent: canonicalize.predict)
    outcome: Outcome | None = None
    done: Canonicalized | None = None  # the core's outcome
    store_ok: bool = True
    ops: list[Op] = field(default_factory=list)
    rewrites: list[str] = field(default_factory=list)
    offered: frozenset[str] | None = None  # fork guard: the tools the request itself offered
    drop_usage_chunk: bool = False  # usage was asked for on the client's behalf
    out: bytes = b""  # what goes upstream
    reply: Reply | None = None
    status: int = 0
    message: dict[str, Any] | None = None  # the reply as the client received it (the next turn replays it)
    route: Route = NO_ROUTE  # where the pool places it: lineage root, recorded replica, new? (section 2c)
    slot: int | None = None  # the llama-server slot pinned in the body (x-prefixpin-slot)
    # Request headers set (replacing the client's of the same name): for a router behind
    # us (affinity.headers), Anthropic's beta for cache diagnostics (provider_cache).
    set_headers: tuple[tuple[str, str], ...] = ()
    keep_message_id: bool = False  # record the response's message id with the turn (provider_cache.diagnostics)
    replica: int | None = None  # the pool replica that answered (x-prefixpin-replica)
    ended: float = 0.0  # perf_counter() when the response ended (the done hooks may run later)
    finished: bool = False  # the done hooks ran
    recording: asyncio.Task[None] | None = None  # a shared store's write of this turn (proxy.addons.record)

    @property
    def big(self) -> bool:
        return is_big(len(self.raw))

    @property
    def editable(self) -> bool:
        return not (self.skip or self.failed) and self.body is not None

    @property
    def model(self) -> Any:
        return self.body.get("model") if self.body is not None else None

    def fail_open(self) -> None:
        """Forward what the client sent: no edits, nothing recorded."""
        self.failed = True
        self.role = "fail-open"
        self.ops = []
        self.rewrites = []
        self.outcome = None
        self.offered = None
        self.drop_usage_chunk = False
        self.route = NO_ROUTE
        self.slot = None
        self.set_headers = ()
        self.keep_message_id = False
