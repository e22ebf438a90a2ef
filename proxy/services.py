"""What the request path needs, built once in the app's lifespan (or by audit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from canonicalize import Canonicalizer
from proxy.config import Config
from proxy.metrics import Metrics
from proxy.recording import Recorder
from proxy.store import Store
from proxy.store.guard import StoreGuard
from proxy.upstream.slot_watch import SlotWatch


def wall_clock() -> float:
    """``time.time()``, looked up at each call."""
    return time.time()


@dataclass
class Services:
    config: Config
    canon: Canonicalizer
    store: Store
    guard: StoreGuard
    metrics: Metrics
    # Wall-clock seconds: lineage records are shared across processes (Redis) and
    # outlive restarts, so their times are the wall clock's.  Tests inject their own.
    clock: Callable[[], float] = wall_clock
    slots: SlotWatch | None = None  # affinity.llama_slots: the llama-servers' slots, as read
    recorder: Recorder | None = None  # trace.path: every request recorded as a trace line
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in a task, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the work spawned so far (audit between lines; shutdown)."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)
