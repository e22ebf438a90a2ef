"""Drive the real request flow offline (``proxy.offline.Offline``: the proxy's own
addons on its own memory store) from synchronous tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from canonicalize import CHAT, Exchange, LineageRecord, Memos, Outcome, Settings
from proxy.config import Config, load
from proxy.flow import Flow
from proxy.offline import Offline


@dataclass
class Sent:
    """One request as prefixpin would forward it."""

    flow: Flow

    @property
    def raw(self) -> bytes:
        """The bytes that go upstream."""
        return self.flow.out

    @property
    def body(self) -> Any:
        return orjson.loads(self.flow.out)

    @property
    def outcome(self) -> Outcome:
        assert self.flow.outcome is not None, f"no outcome (role {self.flow.role})"
        return self.flow.outcome

    @property
    def role(self) -> str:
        return self.flow.role

    @property
    def rewrites(self) -> list[str]:
        return self.flow.rewrites

    @property
    def record(self) -> LineageRecord:
        return self.outcome.record

    @property
    def fork_action(self) -> str | None:
        return self.outcome.fork_action

    @property
    def fork_signal(self) -> str | None:
        return self.outcome.fork_signal

    @property
    def offered(self) -> frozenset[str] | None:
        return self.flow.offered


KEY = {"authorization": "Bearer sk-test"}  # one tenant: a request without a key shares nothing


class Harness:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        config: Config | None = None,
        memos: Memos | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.offline = Offline(config or load(None, env={}), settings=settings, memos=memos, clock=clock)
        self.canon = self.offline.s.canon

    def send(
        self,
        body: dict[str, Any] | bytes,
        *,
        reply: dict[str, Any] | None = None,
        declared: str | None = None,
        headers: dict[str, str] | None = None,
        exchange: Exchange = CHAT,
    ) -> Sent:
        h = dict(headers if headers is not None else KEY)
        if declared:
            h["x-prefixpin-parent"] = declared
        return Sent(self.run(self.next().send(body, exchange=exchange, headers=h, reply=reply)))

    def next(self) -> Offline:
        """The flow the next request goes through (a subclass may take turns between several)."""
        return self.offline

    def run(self, coro: Coroutine[Any, Any, Flow]) -> Flow:
        """Run one request's coroutine (a subclass on a network store keeps one event loop)."""
        return asyncio.run(coro)
