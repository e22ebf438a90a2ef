"""The shell's half of the core's protocol: the request machine
(:mod:`canonicalize.pipeline`) stepped, its needs answered from the store, the
turn it decided written, and its CPU work placed.

:meth:`Driver.canonicalize` starts the machine and answers each
:mod:`canonicalize.needs` need with one store call (a ``Together`` with its
calls at once, one round trip); a store that fails answers ``UNAVAILABLE``
through the circuit breaker (:mod:`proxy.store.guard`), and the request goes on
with its static rules (``fail_open{stage="store"}``).  The spans a request learned
are counted and logged (:mod:`proxy.learned`).  :meth:`Driver.record` writes a
finished request's turn (:mod:`canonicalize.turn`) in one store write, and the
blobs the store says it lost in a second.

Every step of the machine, and the turn's blobs, run where :mod:`proxy.cpu`
places them: on the loop, or for a big body on a worker thread, and from the
machine's ``OffLoop`` on for one whose analysis is heavy (a body under the size
bound made of thousands of system texts).

The live request path (:mod:`proxy.addons.canonicalize`, :mod:`proxy.addons.record`)
and ``prefixpin audit`` (:mod:`proxy.offline`) drive the core through this module
alike.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers

from canonicalize import Canonicalized, Canonicalizer, Exchange, LineageRecord, Request
from canonicalize.needs import (
    UNAVAILABLE,
    Blobs,
    Chain,
    Declared,
    Evidence,
    Marked,
    Need,
    OffLoop,
    Previous,
    Together,
)
from canonicalize.turn import again, turn
from proxy.cpu import off_loop
from proxy.errors import StoreError
from proxy.learned import Suggestions
from proxy.metrics import Metrics
from proxy.store import Store, TenantWide
from proxy.store.guard import StoreGuard

log = logging.getLogger("prefixpin")


class Driver:
    """Steps the core's request machine against one store (module docstring)."""

    def __init__(
        self,
        canon: Canonicalizer,
        store: Store,
        guard: StoreGuard,
        metrics: Metrics,
        *,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        """``new_id``: fresh lineage ids (default: 16 random hex digits, :class:`Ids`)."""
        self.canon = canon
        self.store = store
        self.guard = guard
        self.metrics = metrics
        self.new_id = new_id or Ids()
        self.suggestions = Suggestions(metrics, canon.settings.learn)
        self._names = frozenset(name.encode("latin-1") for name in canon.header_names)

    async def canonicalize(
        self, raw: bytes, exchange: Exchange, tenant: str, headers: Headers, *, remember: bool, big: bool
    ) -> Canonicalized | None:
        """The core's outcome for the request (module docstring); None: its body is not
        a JSON object.  ``remember`` False: nothing of it is kept for its
        conversation's next request; ``big``: its steps run on a worker thread."""
        named = read_named(headers, self._names)
        machine = self.canon.start(Request(raw, exchange, tenant, named, self.new_id(), remember))
        need = machine.send() if not big else await off_loop(machine.send)
        while need is not None:
            if isinstance(need, OffLoop):  # heavy from here on: the rest on a worker thread
                big = True
                need = await off_loop(machine.send)
                continue
            answer = await self._answer(need, tenant)
            need = machine.send(answer) if not big else await off_loop(machine.send, answer)
        done = machine.result
        if done is not None:
            if done.learned is not None:
                self.suggestions.note(tenant, done.learned)
            if done.outcome is None:
                self.metrics.fail_open.labels("store").inc()
        return done

    async def _answer(self, need: Need[Any], tenant: str) -> object:
        """``need``'s answer from the store, or UNAVAILABLE."""
        try:
            return await self.guard.call(lambda: self._ask(need, tenant))
        except StoreError:
            return UNAVAILABLE

    def _ask(self, need: Need[Any], tenant: str) -> Awaitable[Any]:
        """The store's call that answers ``need``."""
        store = self.store
        if isinstance(need, Chain):
            return store.lookup(tenant, need.links, need.declared, origin=need.origin, sent=need.sent)
        if isinstance(need, Blobs):
            return store.blobs(tenant, need.refs, need.owner)
        if isinstance(need, Previous):
            return store.response(tenant, need.response_id)
        if isinstance(need, Together):
            return asyncio.gather(*(self._ask(n, tenant) for n in need.needs))
        return self._tenant_wide(need, tenant)

    async def _tenant_wide(self, need: Need[Any], tenant: str) -> Any:
        store = self.store
        if isinstance(need, Declared):
            return (await store.lookup(tenant, (), need.lineage, origin=need.lineage)).declared
        if isinstance(need, Marked):
            return (await store.tenant_wide(tenant, need.links, ()))[0]
        if isinstance(need, Evidence):
            return (await store.tenant_wide(tenant, (), need.refs))[1]
        raise TypeError(f"no answer for {need!r}")

    async def record(
        self,
        tenant: str,
        done: Canonicalized,
        forwarded: bytes,
        reply: dict[str, Any] | None,
        record: LineageRecord,
        *,
        big: bool,
    ) -> None:
        """Write ``done``'s turn as ``record``: ``forwarded`` went upstream, ``reply`` came
        back (None: nothing to replay).  The blobs the store answers it lost are written
        again at once, so later forks find them.  A failure costs the record only
        (``fail_open{stage="record"}``)."""
        store, guard = self.store, self.guard
        try:
            written = (
                turn(done, forwarded, reply, record)
                if not big
                else await off_loop(turn, done, forwarded, reply, record)
            )
            wide = TenantWide(written.marks, record.first, written.shared_blobs)
            missing = await guard.call(
                lambda: store.record(
                    tenant,
                    record,
                    written.links,
                    written.blobs,
                    written.touch,
                    origin=written.origin,
                    wide=wide,
                    response=written.response,
                )
            )
            if missing:  # touched blobs the store lost: written again now, for the next fork
                blobs = again(done, forwarded, missing) if not big else await off_loop(again, done, forwarded, missing)
                if blobs:
                    await guard.call(lambda: store.record(tenant, record, (), blobs, ()))
        except StoreError as exc:
            log.debug("store record failed: %s", exc)
            self.metrics.fail_open.labels("record").inc()
        except Exception:
            log.exception("recording failed")
            self.metrics.fail_open.labels("record").inc()


def read_named(headers: Headers, names: frozenset[bytes]) -> dict[str, str]:
    """The first value of each header ``names`` names (lowercase), in one pass over the
    request's: the core reads a few, most absent, and a dict answers an absent one at
    a fraction of ``Headers.get``'s cost (a scan and a raised ``KeyError`` each)."""
    found: dict[str, str] = {}
    for name, value in headers.raw:
        if name in names:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


class Ids:
    """New lineage ids: 16 hex digits from the OS's CSPRNG, drawn 64 at a time (one
    ``getrandom`` per 64 requests, not one per request)."""

    def __init__(self) -> None:
        self._pool: list[str] = []

    def __call__(self) -> str:
        if not self._pool:
            pool = secrets.token_hex(8 * 64)
            self._pool = [pool[i : i + 16] for i in range(0, len(pool), 16)]
        return self._pool.pop()


__all__ = ["Driver", "Ids", "read_named"]
