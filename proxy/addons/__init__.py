"""The request path as an ordered tuple of small addons (mitmproxy's model).

    ADDONS = (Bypass, Tenancy, Canonicalize, StreamUsage, ProviderCache, ForkGuard, Affinity, Measure, Record,
              Trace)

``Trace`` is there only with ``trace.path`` (proxy.recording).

The tuple *is* the execution order.  An addon implements one or both hooks, each a
typed protocol:

- :class:`RequestHook` ``async request(flow)``: before the upstream, decides what
  goes out;
- :class:`DoneHook` ``done(flow)``: after the response ended (streamed or not),
  counts and records.  A done hook that only counts (``counts_only = True``:
  measure, provider cache) may run a little later, off the next request's critical
  path: :meth:`Runner.done` with ``later=True`` queues it, and :meth:`Runner.drain`
  runs the queue (the handler calls it while a request waits on the upstream, a
  timer within ``DRAIN_S`` when nothing does, ``/metrics`` before it answers).

One :class:`Runner` runs every hook.  A hook that raises fails open: the flow
forwards what the client sent (``x-prefixpin-role: fail-open``) and
``prefixpin_fail_open_total{stage=<addon name>}`` counts it; a failure after
the response only costs that addon's work.  prefixpin's own failures never
become an error for the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from canonicalize import render
from proxy.addons.affinity import Affinity
from proxy.addons.bypass import Bypass
from proxy.addons.canonicalize import Canonicalize
from proxy.addons.fork_guard import ForkGuard
from proxy.addons.measure import Measure
from proxy.addons.provider_cache import ProviderCache
from proxy.addons.record import Record
from proxy.addons.stream_usage import StreamUsage
from proxy.addons.tenancy import Tenancy
from proxy.addons.trace import Trace
from proxy.drive import Driver
from proxy.flow import Flow
from proxy.metrics import Metrics
from proxy.services import Services

log = logging.getLogger("prefixpin")
T = TypeVar("T")
DRAIN_S = 0.005  # the longest the counting hooks wait when no request drains them first


@runtime_checkable
class RequestHook(Protocol):
    """Before the upstream: reads the flow, decides (edits, role, routing)."""

    name: str  # the stage in prefixpin_fail_open_total{stage}

    async def request(self, flow: Flow) -> None: ...


@runtime_checkable
class DoneHook(Protocol):
    """After the response: counts or records; never changes what the client got."""

    name: str
    counts_only: bool  # True: may run a little later (Runner.done)

    def done(self, flow: Flow) -> None: ...


Addon = RequestHook | DoneHook


def build(s: Services, *, new_id: Callable[[], str] | None = None) -> tuple[Addon, ...]:
    """The addons of one app, in execution order.  ``new_id``: lineage ids."""
    driver = Driver(s.canon, s.store, s.guard, s.metrics, new_id=new_id)
    addons: tuple[Addon, ...] = (
        Bypass(),
        Tenancy(s.config.tenancy),
        Canonicalize(s, driver),
        StreamUsage(),
        ProviderCache(s),
        ForkGuard(),
        Affinity(s.config.affinity, s.slots),
        Measure(s.metrics),
        Record(s, driver),
    )
    return addons if s.recorder is None else (*addons, Trace(s.recorder))


class Runner:
    """Runs each hook of each addon in order; fails open on any exception."""

    def __init__(self, addons: tuple[Addon, ...], metrics: Metrics) -> None:
        self.addons = addons
        self.metrics = metrics
        self._request = tuple(a for a in addons if isinstance(a, RequestHook))
        self._done = tuple(a for a in addons if isinstance(a, DoneHook))
        self._now = tuple(a for a in self._done if not a.counts_only)
        self._later = tuple(a for a in self._done if a.counts_only)
        self.pending: list[Flow] = []  # flows whose counting hooks wait for drain()
        self._timer: asyncio.TimerHandle | None = None

    async def request(self, flow: Flow) -> None:
        for addon in self._request:
            try:
                await addon.request(flow)
            except Exception:
                self.failed(flow, addon.name)

    def done(self, flow: Flow, *, later: bool = False) -> None:
        """Every done hook; with ``later``, the counting ones are queued for :meth:`drain`
        (the rest, record among them, run now: the next turn's lookup needs them)."""
        flow.ended = time.perf_counter()
        hooks = self._now if later else self._done
        for addon in hooks:
            self._run_done(addon, flow)
        if later and self._later:
            self.pending.append(flow)
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(DRAIN_S, self.drain)

    def drain(self) -> None:
        """Run the queued counting hooks, in the order their responses ended."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self.pending = self.pending, []
        for flow in pending:
            for addon in self._later:
                self._run_done(addon, flow)

    def _run_done(self, addon: DoneHook, flow: Flow) -> None:
        try:
            addon.done(flow)
        except Exception:
            log.exception("addon %s failed after the response", addon.name)
            self.metrics.fail_open.labels(addon.name).inc()

    def render(self, flow: Flow) -> None:
        """``flow.out``: the edits spliced into the client's bytes, or those bytes as
        they are when there is nothing to edit or splicing fails (fail open)."""
        flow.out = flow.raw
        if flow.ops and flow.doc is not None and not flow.failed:
            doc, ops = flow.doc, flow.ops
            flow.out = self.guard(flow, "canonicalize", lambda: render(doc, ops), flow.raw)

    def guard(self, flow: Flow, stage: str, fn: Callable[[], T], fallback: T) -> T:
        """``fn()``, or ``fallback`` with the flow failed open when it raises."""
        try:
            return fn()
        except Exception:
            self.failed(flow, stage)
            return fallback

    def failed(self, flow: Flow, stage: str, exc: Any = None) -> None:
        log.exception("%s failed; forwarding the request as the client sent it", stage)
        self.metrics.fail_open.labels(stage).inc()
        flow.fail_open()


__all__ = ["Addon", "DoneHook", "RequestHook", "Runner", "build"]
