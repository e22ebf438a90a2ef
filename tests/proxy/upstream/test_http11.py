"""The read timeout of one upstream connection (``http11.Connection.wait``): one timer
per connection, armed lazily, that still fails each wait at its own deadline."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from proxy.errors import UpstreamTimeout
from proxy.upstream import http11


def _run(main: object, loop: str) -> None:
    factory = asyncio.new_event_loop if loop == "asyncio" else uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)  # type: ignore[arg-type]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_short_wait_after_a_long_one_times_out_at_its_own_deadline(loop: str) -> None:
    async def main() -> None:
        ev = asyncio.get_running_loop()
        conn = http11.Connection(ev, "upstream")
        answered: asyncio.Future[int] = ev.create_future()
        ev.call_soon(answered.set_result, 1)
        assert await conn.wait(answered, 600) == 1  # leaves its timer armed for 600 s
        started = ev.time()
        with pytest.raises(UpstreamTimeout) as info:
            await conn.wait(ev.create_future(), 0.05)
        assert ev.time() - started < 5
        assert "nothing in 0.05 s" in info.value.detail

    _run(main(), loop)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_waits_that_each_end_in_time_never_time_out_whatever_they_sum_to(loop: str) -> None:
    async def main() -> None:
        ev = asyncio.get_running_loop()
        conn = http11.Connection(ev, "upstream")
        for i in range(6):  # 6 x 0.04 s, past the 0.1 s timeout in all
            piece: asyncio.Future[int] = ev.create_future()
            ev.call_later(0.04, piece.set_result, i)
            assert await conn.wait(piece, 0.1) == i

    _run(main(), loop)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_stall_after_pieces_in_time_times_out(loop: str) -> None:
    async def main() -> None:
        ev = asyncio.get_running_loop()
        conn = http11.Connection(ev, "upstream")
        for i in range(3):
            piece: asyncio.Future[int] = ev.create_future()
            ev.call_later(0.03, piece.set_result, i)
            await conn.wait(piece, 0.1)
        with pytest.raises(UpstreamTimeout):
            await conn.wait(ev.create_future(), 0.1)

    _run(main(), loop)


def test_a_lost_connection_drops_its_timer() -> None:
    """The loop's timer would hold the connection (and what it read) until it fires."""

    async def main() -> None:
        ev = asyncio.get_running_loop()
        conn = http11.Connection(ev, "upstream")
        done: asyncio.Future[None] = ev.create_future()
        ev.call_soon(done.set_result, None)
        await conn.wait(done, 600)
        assert conn._deadline.armed
        conn.connection_lost(None)
        assert not conn._deadline.armed

    asyncio.run(main())
