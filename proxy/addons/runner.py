"""The one runner of the addons' hooks (see :mod:`proxy.addons`), failing open.

A request's hooks run in the tuple's order before the upstream
(:meth:`Runner.request`); once its response is over, each done hook runs at the
moment it names: :meth:`Runner.before_last` (the body writer awaits it before the
client's last bytes: ``proxy.relay``), :meth:`Runner.after_last` (the handler,
right after them, whatever the response was), and the counting ones after that,
off the request's path (:mod:`proxy.addons.counting`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol, runtime_checkable

from proxy.addons.counting import Counting
from proxy.flow import Flow
from proxy.metrics import Metrics

log = logging.getLogger("prefixpin")


@runtime_checkable
class RequestHook(Protocol):
    """Before the upstream: reads the flow's decisions, adds its own."""

    name: str  # the stage in prefixpin_fail_open_total{stage}

    @property
    def needs(self) -> tuple[type, ...]:
        """The decisions it reads (proxy.flow)."""

    @property
    def provides(self) -> tuple[type, ...]:
        """The decisions it makes."""

    def request(self, flow: Flow) -> Awaitable[None] | None:
        """Its decisions made, or what to await for them (only a hook that waits on I/O
        returns one: a coroutine per hook per request is not free)."""


@runtime_checkable
class DoneHook(Protocol):
    """Once the response is over: counts or records; never changes what the client got."""

    name: str

    @property
    def needs(self) -> tuple[type, ...]:
        """The decisions it reads (proxy.flow)."""

    @property
    def when(self) -> str:
        """``before_last_byte``, ``after_last_byte`` or ``counted`` (module docstring)."""

    def done(self, flow: Flow) -> Awaitable[None] | None:
        """Its work, or what to await for it (a record written before the next moment)."""


Addon = RequestHook | DoneHook


class Runner:
    """Runs each hook of each addon in order; fails open on any exception."""

    def __init__(self, addons: tuple[Addon, ...], metrics: Metrics) -> None:
        self.addons = addons
        self.metrics = metrics
        self._request = tuple(a for a in addons if isinstance(a, RequestHook))
        done = tuple(a for a in addons if isinstance(a, DoneHook))
        self._before = tuple(a for a in done if a.when == "before_last_byte")
        self._after = tuple(a for a in done if a.when == "after_last_byte")
        counted = tuple(a for a in done if a.when == "counted")
        self.counting = Counting(counted, self.done, metrics.fail_open.labels("counting").inc)

    @property
    def before_last_hooks(self) -> bool:
        """Is a hook waiting for the moment before the last byte (a shared store's record)?"""
        return bool(self._before)

    async def request(self, flow: Flow) -> None:
        for addon in self._request:
            try:
                pending = addon.request(flow)
                if pending is not None:
                    await pending
            except Exception:
                self.failed(flow, addon.name)

    async def before_last(self, flow: Flow) -> None:
        """The hooks of the moment before the client's last bytes go out."""
        await self.done(self._before, flow)

    async def after_last(self, flow: Flow) -> None:
        """The hooks of the moment right after the response ended; then its counting is
        queued."""
        flow.answer.ended = time.perf_counter()
        await self.done(self._after, flow)
        self.counting.put(flow)

    async def done(self, hooks: tuple[DoneHook, ...], flow: Flow) -> None:
        """Each of ``hooks``' done hook, in order; one that raises costs its own work only."""
        for addon in hooks:
            try:
                pending = addon.done(flow)
                if pending is not None:
                    await pending
            except Exception:
                log.exception("addon %s failed after the response", addon.name)
                self.metrics.fail_open.labels(addon.name).inc()

    def failed(self, flow: Flow, stage: str, exc: Any = None) -> None:
        """``stage`` failed: the flow is forwarded as the client sent it, and counted."""
        log.exception("%s failed; forwarding the request as the client sent it", stage)
        self.metrics.fail_open.labels(stage).inc()
        flow.fail_open()


__all__ = ["Addon", "DoneHook", "RequestHook", "Runner"]
