"""Requests of many sessions, big and small, in the order they arrive, and a switch
interval that makes threads interleave finely: for tests of what threads share."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from canonicalize.memo import TOOL_LISTS
from tests import hermes

# One tool list more than the tools memo holds, sent round robin: every request's list
# is the memo's oldest, the one the next request evicts while another thread reads it.
VARIANTS = TOOL_LISTS + 1


@contextmanager
def switching_often() -> Iterator[None]:
    """Threads switch as often as the interpreter lets them: a window between two
    steps that should be one is hit in a second, not in a day."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class Arrivals:
    """Requests in the order they arrive: session ``n % VARIANTS`` sends the n-th, with
    tools of its own; ``requests`` in all."""

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self._next = 0
        self._lock = threading.Lock()
        self.tools = [orjson.dumps(_tools(n)) for n in range(VARIANTS)]
        history: list[dict[str, Any]] = []
        for i in range(60):  # a long session with big tool outputs
            history.append({"role": "user", "content": f"read file {i}"})
            history.append({"role": "assistant", "content": f"reading {i}"})
            history.append({"role": "user", "content": f"file {i}: " + "x" * 20_000})
        self.big_head = _head(hermes.request(hermes.system_prompt(), history))
        self.small_head = _head({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        # Small, but heavy to analyse (canonicalize.pipeline.heavy): 300 system messages.
        rules = [{"role": "system", "content": f"rule {i}: be brief"} for i in range(300)]
        self.heavy_head = _head({"model": "m", "messages": [*rules, {"role": "user", "content": "hi"}]})

    def take(self) -> int | None:
        with self._lock:
            n, self._next = self._next, self._next + 1
        return n if n < self.requests else None

    def body(self, n: int, *, big: bool, heavy: bool = False) -> bytes:
        head = self.big_head if big else self.heavy_head if heavy else self.small_head
        raw = head + self.tools[n % VARIANTS] + b"}"
        assert not big or 1 << 20 <= len(raw) < 4 << 20
        return raw


def _tools(n: int) -> list[dict[str, Any]]:
    tools = hermes.tools_full()
    tools[0]["function"]["description"] += f" (variant {n})"
    return tools


def _head(body: dict[str, Any]) -> bytes:
    """The body's bytes up to where its tools[] go."""
    return orjson.dumps(body)[:-1] + b',"tools":'
