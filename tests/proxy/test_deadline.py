"""proxy.deadline: one lazily armed timer keeps a deadline that moves."""

from __future__ import annotations

import asyncio

from proxy.deadline import Deadline


def test_moved_later_before_it_passes_it_expires_once_at_the_last_deadline() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        start = loop.time()
        d = Deadline(loop, lambda: fired.append(loop.time() - start))
        for _ in range(5):  # moved 5 times, 0.03 s apart, each 0.1 s ahead
            d.set(0.1)
            await asyncio.sleep(0.03)
        await asyncio.sleep(0.3)
        return fired

    fired = asyncio.run(main())
    assert len(fired) == 1 and fired[0] >= 0.12 + 0.1 - 0.02


def test_a_shorter_deadline_arms_an_earlier_timer() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        start = loop.time()
        d = Deadline(loop, lambda: done.set_result(loop.time() - start))
        d.set(60)
        d.set(0.05)
        return await asyncio.wait_for(done, 5)

    assert asyncio.run(main()) < 5


def test_cleared_or_cancelled_it_never_expires() -> None:
    async def main() -> tuple[list[int], bool]:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        cleared = Deadline(loop, lambda: fired.append(1))
        cleared.set(0.02)
        cleared.clear()  # its timer stays armed and finds no deadline
        cancelled = Deadline(loop, lambda: fired.append(2))
        cancelled.set(0.02)
        cancelled.cancel()
        await asyncio.sleep(0.1)
        return fired, cleared.armed or cancelled.armed

    assert asyncio.run(main()) == ([], False)
