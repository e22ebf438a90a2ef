"""Lookup -> classify -> (fork: parent blobs) -> finalize: the store half of a request.

Shared by the proxy's request path and by ``prefixpin audit``, which replays a
trace against an embedded store.  Store failures are reported, not raised: the
request then goes on as a root with its static rewrites (fail open).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from canonicalize import Canonicalizer, Lookup, Outcome, Prepared, blobs_needed, chain
from proxy.errors import StoreError
from proxy.store import Store

T = TypeVar("T")
Call = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def _direct(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


@dataclass(slots=True)
class Resolved:
    outcome: Outcome
    store_ok: bool


async def resolve(
    canon: Canonicalizer,
    store: Store,
    tenant: str,
    prep: Prepared,
    *,
    call: Call = _direct,
    new_id: Callable[[], str] = lambda: secrets.token_hex(8),
) -> Resolved:
    """Classify ``prep`` against the store and finalize it (raises only on canonicalize bugs)."""
    store_ok = True
    try:
        lookup = await call(lambda: store.lookup(tenant, prep.links, prep.signals.declared_parent))
    except StoreError:
        lookup, store_ok = Lookup(), False
    decision = canon.classify(prep, lookup)
    parent: dict[str, Any] = {}
    refs = blobs_needed(decision)
    if refs is not None and store_ok:
        try:
            found = await call(lambda: store.blobs(tenant, refs))
        except StoreError:
            found, store_ok = [None, None], False
        if found[0] is not None and found[1] is not None:
            parent = {
                "parent_system": orjson.loads(found[0]),
                "parent_tools": orjson.loads(found[1]),
                "have_parent_blobs": True,
            }
    outcome = canon.finalize(prep, lookup, decision, new_id=new_id(), **parent)
    return Resolved(outcome, store_ok)


async def record(
    store: Store,
    tenant: str,
    prep: Prepared,
    outcome: Outcome,
    reply: dict[str, Any] | None,
    *,
    call: Call = _direct,
) -> None:
    """Record the request's links, its reply's link and the lineage (raises StoreError)."""
    links = list(outcome.links)
    if reply is not None:
        links.append(chain.extend(prep.dialect, prep.links, reply))
    await call(lambda: store.record(tenant, outcome.record, links, outcome.blobs, outcome.touch))
