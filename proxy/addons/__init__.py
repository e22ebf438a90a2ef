"""The request path as an ordered tuple of small addons (mitmproxy's model).

    ADDONS = (Bypass, Tenancy, Canonicalize, StreamUsage, ProviderCache, ForkGuard, Affinity, Measure, Record)

The tuple *is* the execution order.  Each addon may implement

- ``async request(flow)``: before the upstream, decides what goes out;
- ``done(flow)``: after the response ended (streamed or not), counts and records.

One :class:`Runner` runs every hook.  A hook that raises fails open: the flow
forwards what the client sent (``x-prefixpin-role: fail-open``) and
``prefixpin_fail_open_total{stage=<addon name>}`` counts it; a failure after
the response only costs that addon's work.  prefixpin's own failures never
become an error for the client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

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
from proxy.flow import Flow
from proxy.metrics import Metrics
from proxy.services import Services

log = logging.getLogger("prefixpin")
T = TypeVar("T")


class Addon(Protocol):
    name: str


def build(s: Services) -> tuple[Addon, ...]:
    """The addons of one app, in execution order."""
    return (
        Bypass(),
        Tenancy(s.config.tenancy),
        Canonicalize(s),
        StreamUsage(),
        ProviderCache(s),
        ForkGuard(),
        Affinity(s.config.affinity),
        Measure(s.metrics),
        Record(s),
    )


class Runner:
    """Runs each hook of each addon in order; fails open on any exception."""

    def __init__(self, addons: tuple[Addon, ...], metrics: Metrics) -> None:
        self.addons = addons
        self.metrics = metrics
        self._request = tuple(a for a in addons if hasattr(a, "request"))
        self._done = tuple(a for a in addons if hasattr(a, "done"))

    async def request(self, flow: Flow) -> None:
        for addon in self._request:
            try:
                await addon.request(flow)
            except Exception:
                self.failed(flow, addon.name)

    def done(self, flow: Flow) -> None:
        for addon in self._done:
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


__all__ = ["Addon", "Runner", "build"]
