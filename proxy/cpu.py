"""Where CPU work runs: the one place that decides.

A body of ``OFFLOAD_BYTES`` (1 MiB) and up is parsed, hashed, finalized, spliced
and cut into blobs on a worker thread, so one huge request never stalls the event
loop (and /healthz) for the others: :func:`off_loop` when ``big``.  Anything smaller
runs on the loop, where the hop to a thread would cost more than the work.  The
core's memos are safe to share between threads (canonicalize.memo).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
OFFLOAD_BYTES = 1 << 20


def is_big(size: int) -> bool:
    """Does a body of ``size`` bytes take its CPU work to a worker thread?"""
    return size >= OFFLOAD_BYTES


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread: the work of a big body.  A small one's runs
    inline, ``fn(*args) if not big else await off_loop(fn, *args)`` (not through a
    coroutine: one per step of every request would cost more than the branch)."""
    return await asyncio.to_thread(fn, *args)


__all__ = ["OFFLOAD_BYTES", "is_big", "off_loop"]
