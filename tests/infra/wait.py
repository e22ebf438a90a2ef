"""Waiting on a condition: call it until it holds, or fail after a deadline.

Tests wait for what they need (a counter, a metric, an event, a socket's state),
never for a fixed time.  Every poll goes through here, so the timeout and the
failure message are the same everywhere::

    wait_until(lambda: len(up.requests) == 1, message="the upstream has the request")
    state = wait_until(lambda: status()["closed"], timeout=5)  # the truthy value is returned
    await wait_until_async(lambda: store.size() == 0)          # on an event loop; may be async

A condition may raise to stop the wait at once (a process that exited).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT_S = 10.0
INTERVAL_S = 0.02


class WaitTimeout(AssertionError):
    """The condition did not hold within the timeout (an assertion: the test fails)."""


def _failed(message: str | Callable[[], str], timeout: float) -> WaitTimeout:
    text = message() if callable(message) else message
    return WaitTimeout(f"not within {timeout:g} s: {text or 'the condition'}")


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float = TIMEOUT_S,
    interval: float = INTERVAL_S,
    message: str | Callable[[], str] = "",
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy,
    and return that.  After ``timeout`` seconds: :class:`WaitTimeout` saying
    ``message`` (a callable is called then, to say what was seen last).

    Blocks the thread between calls: an event loop running in this thread does
    not run meanwhile (use :func:`wait_until_async` there)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise _failed(message, timeout)
        time.sleep(interval)
    return value


async def wait_until_async(
    condition: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = TIMEOUT_S,
    interval: float = INTERVAL_S,
    message: str | Callable[[], str] = "",
) -> T:
    """:func:`wait_until` on an event loop, which runs between calls; ``condition``
    may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failed(message, timeout)
        await asyncio.sleep(interval)


__all__ = ["WaitTimeout", "wait_until", "wait_until_async"]
