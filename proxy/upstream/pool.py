"""``upstream.pool``: one :class:`UpstreamClient` per replica, health, load and failover.

A :class:`Pool` has :class:`UpstreamClient`'s interface (``send``, ``read``,
``aclose``) plus the request's affinity key; with no pool configured it holds
the one ``upstream.url`` and behaves exactly as that client.

- The :mod:`policy <proxy.upstream.policy>` chooses a replica from the request's
  :class:`~proxy.upstream.policy.Route` (its key, the replica the lineage's record
  names, whether the lineage is new), each replica's health and this process's load
  there: its requests in flight and its live lineages (proxy.upstream.live: a
  lineage counts from the moment it is placed).  A lineage whose record names no
  replica, but which this process placed lately, is offered that replica first.
- A replica that refuses the connection or times out connecting is marked down
  for ``affinity.retry_after_s`` (its lineages move to their next replica on the
  ring) and the request goes to the next replica, once.  Only then: the error
  says the request never reached the replica (``UpstreamError.never_sent``).  A
  request that was written, even partly, is never sent again.
- The response's replica index is ``Response.replica``; it counts as in flight
  until its body is closed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from proxy.config import Config
from proxy.errors import UpstreamError
from proxy.metrics import Metrics
from proxy.redact import redact
from proxy.upstream.client import UpstreamClient, upstream_url
from proxy.upstream.live import LiveLineages
from proxy.upstream.message import Body, Response
from proxy.upstream.notfound import NotFound
from proxy.upstream.policy import NO_ROUTE, Policy, Replica, RoundRobin, Route, make_policy
from proxy.upstream.transport import open_transport


class _Tracked:
    """The response body; closing it ends the request's time in flight (once)."""

    __slots__ = ("_inner", "_pieces", "_release")

    def __init__(self, inner: Body, release: Callable[[], None]) -> None:
        self._inner = inner
        self._pieces: AsyncIterator[bytes] = aiter(inner)
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> _Tracked:
        return self

    async def __anext__(self) -> bytes:
        return await anext(self._pieces)  # (its own iterator: an async generator costs the loop's bookkeeping)

    def at_end(self) -> bool:
        return self._inner.at_end()

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._done()


class Pool:
    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        transport: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        listening: Sequence[tuple[str, int]] = (),
    ) -> None:
        """``transport``: an httpx transport standing in for the network (unit tests);
        ``listening``: this process's listening addresses, where no request may go."""
        up = config.upstream
        self.pooled = bool(up.pool)
        shared = open_transport(config, transport, listening)
        self.clients = [UpstreamClient(replace(up, url=url), shared) for url in up.urls]
        self.policy: Policy = make_policy(config.affinity, len(self.clients))
        self.passthrough_policy: Policy = RoundRobin()  # passthrough routes: any healthy replica
        self.retry_after_s = config.affinity.retry_after_s
        self.metrics = metrics
        self.clock = clock
        self.in_flight = [0] * len(self.clients)
        self.down_until = [0.0] * len(self.clients)
        self.live = LiveLineages(len(self.clients))
        self.not_found = NotFound(clock=clock)
        if self.pooled:
            for i in range(len(self.clients)):
                metrics.replica_requests.labels(str(i))

    @property
    def base(self) -> str:
        return self.clients[0].base

    def replicas(self, *, skip: int | None = None) -> list[Replica]:
        now = self.clock()
        live = self.live.counts(now)
        return [
            Replica(i, i != skip and self.down_until[i] <= now, self.in_flight[i], live[i])
            for i in range(len(self.clients))
        ]

    async def send(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        content: bytes,
        *,
        route: Route = NO_ROUTE,
        timeout: float | None = None,
        sticky: bool = True,
    ) -> Response:
        """Send to the replica the policy chooses (``sticky=False``: round robin);
        once more to the next one when the first provably never got the request."""
        if not self.pooled:
            return await self._send_to(0, method, path, query, headers, content, timeout)
        policy = self.policy if sticky else self.passthrough_policy
        if route.key is not None and route.home is None and not route.new:
            route = replace(route, home=self.live.where(route.key, self.clock()))
        index = policy.choose(route, self.replicas())
        try:
            return await self._send_to(index, method, path, query, headers, content, timeout, route.key)
        except UpstreamError as exc:
            if not exc.never_sent:
                raise
            self.down_until[index] = self.clock() + self.retry_after_s
            retry = policy.choose(route, self.replicas(skip=index))
            if retry == index:
                raise
            self.metrics.replica_failovers.inc()
            return await self._send_to(retry, method, path, query, headers, content, timeout, route.key)

    async def _send_to(
        self,
        index: int,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        content: bytes,
        timeout: float | None,
        key: str | None = None,
    ) -> Response:
        if key is not None:  # placed: live there from now (a new lineage after it counts it)
            self.live.touch(key, index, self.clock())
        self.in_flight[index] += 1
        try:
            resp = await self.clients[index].send(method, path, query, headers, content, timeout=timeout)
        except BaseException:
            self.in_flight[index] -= 1
            raise
        self.down_until[index] = 0.0
        if self.pooled:
            self.metrics.replica_requests.labels(str(index)).inc()

        def release() -> None:
            self.in_flight[index] -= 1

        if self.pooled:
            resp.body = _Tracked(resp.body, release)
        else:
            release()  # nothing to balance
        resp.replica = index
        return resp

    def answered(self, index: int, path: str, status: int, body: bytes) -> None:
        """Replica ``index`` answered a wire route's POST to ``path`` with ``status``
        (``body``: the start of its answer; proxy.upstream.notfound)."""
        if status < 400 and self.not_found.served(index):
            return  # the usual case, at once
        where = redact(upstream_url(self.clients[index].base, path))
        self.not_found.answered(index, "POST", path, where, status, body)

    async def health(self) -> list[str | None]:
        """Each replica's problem (None when its ``/health`` answers below 500, and a
        wire route it answered with 404 is there when asked again)."""
        out: list[str | None] = []
        for i, client in enumerate(self.clients):
            try:
                r = await client.send("GET", "/health", "", [], b"", timeout=2)
                await r.aclose()
                out.append(f"answered {r.status}" if r.status >= 500 else await self._route(i))
            except UpstreamError as exc:
                if exc.never_sent and self.pooled:
                    self.down_until[i] = self.clock() + self.retry_after_s
                out.append(str(exc))  # names no URL
        return out

    async def _route(self, index: int) -> str | None:
        """A route the replica answered with 404, asked again: a POST of ``{}`` (no
        generation can start from it) gets a 4xx of the route where there is one."""
        path = self.not_found.missing(index)
        if path is None:
            return None
        headers = [("content-type", "application/json")]
        r = await self.clients[index].send("POST", path, "", headers, b"{}", timeout=2)
        await r.aclose()
        if r.status != 404:
            self.not_found.found(index)
            return None
        return f"answers 404 to POST {path}: no such route under upstream.url's path (is that path right?)"

    def describe(self, index: int) -> str:
        return redact(self.clients[index].base)

    async def aclose(self) -> None:
        await self.clients[0].aclose()  # the transport they share


__all__ = ["Pool"]
