"""proxy.upstream.cap: the cap on open upstream connections never leaves a slot unused
while a request waits — a closed connection's slot, a released connection, an idle
one to another origin, a wake-up that races its waiter's timeout."""

from __future__ import annotations

import asyncio
import threading

from proxy.errors import UpstreamTimeout
from proxy.upstream.cap import Cap
from proxy.upstream.connections import Connections
from proxy.upstream.message import Request, Timeouts
from proxy.upstream.target import Base
from tests.infra import rawupstream as raw
from tests.infra.wait import wait_until_async


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _cap(limit: int = 1) -> Cap[Conn]:
    return Cap(limit, close=Conn.close)


def _never() -> bool:
    return False


def test_a_closed_connections_slot_goes_to_the_first_waiter() -> None:
    async def main() -> list[str]:
        cap = _cap()
        order: list[str] = []
        assert await cap.take("a", 1, _never) is None and cap.open == 1

        async def wait(name: str) -> None:
            assert await cap.take("a", 5, _never) is None
            order.append(name)

        tasks = [asyncio.ensure_future(wait(n)) for n in ("first", "second")]
        await asyncio.sleep(0)
        cap.give()  # the slot changes hands
        await asyncio.sleep(0)
        assert cap.open == 1 and order == ["first"]
        cap.give()
        await asyncio.gather(*tasks)
        cap.give()
        assert cap.open == 0
        return order

    assert asyncio.run(main()) == ["first", "second"]


def test_a_released_connection_goes_to_a_waiter_for_its_origin_with_its_slot() -> None:
    async def main() -> None:
        cap = _cap()
        await cap.take("a", 1, _never)
        other = asyncio.ensure_future(cap.take("b", 5, _never))
        mine = asyncio.ensure_future(cap.take("a", 5, _never))
        await asyncio.sleep(0)
        conn = Conn("a1")
        assert cap.hand("a", conn)  # the waiter for "a", though "b" waits longer
        assert await mine is conn and cap.open == 1 and not other.done()
        assert not cap.hand("c", Conn("c1"))  # nobody waits for "c"
        other.cancel()

    asyncio.run(main())


def test_a_request_finding_no_slot_closes_an_idle_connection_first() -> None:
    async def main() -> None:
        cap = _cap()
        await cap.take("a", 1, _never)

        def evict() -> bool:
            cap.give()  # what closing an idle connection does
            return True

        assert await cap.take("b", 0.01, evict) is None and cap.open == 1

    asyncio.run(main())


def test_a_waiter_whose_time_runs_out_is_told_so() -> None:
    async def main() -> None:
        cap = _cap()
        await cap.take("a", 1, _never)
        try:
            await cap.take("a", 0.01, _never)
        except UpstreamTimeout as exc:
            assert "free connection" in str(exc)
        else:
            raise AssertionError("no timeout")
        assert cap.open == 1 and not cap.waiting

    asyncio.run(main())


def test_a_wake_up_that_races_the_waiters_timeout_is_not_lost() -> None:
    """The slot is handed over in the same loop turn the waiter's time runs out: the
    waiter keeps it (before, it raised a timeout and the slot was lost to everyone)."""

    async def main() -> None:
        cap = _cap()
        await cap.take("a", 1, _never)
        # A deadline already passed: the timeout fires in the loop's next turn, after this
        # task's; the slot is handed over in between.
        waiter = asyncio.ensure_future(cap.take("a", 0, _never))
        await asyncio.sleep(0)
        cap.give()
        assert await waiter is None
        assert cap.open == 1 and not cap.waiting

    asyncio.run(main())


def test_a_waiter_cancelled_once_woken_passes_what_it_got_on() -> None:
    async def main() -> None:
        cap = _cap()
        await cap.take("a", 1, _never)
        first = asyncio.ensure_future(cap.take("a", 5, _never))
        second = asyncio.ensure_future(cap.take("a", 5, _never))
        await asyncio.sleep(0)
        conn = Conn("a1")
        cap.hand("a", conn)  # first is woken with it ...
        first.cancel()  # ... and cancelled (its client left) before it ran
        await asyncio.sleep(0)
        assert first.cancelled() and conn.closed  # closed, its slot passed on
        assert await second is None and cap.open == 1

    asyncio.run(main())


# -- the transport: one connection allowed, requests to one origin and to two ----------------------------


def _request(url: str) -> Request:
    base = Base.parse(url)
    return Request("POST", base.origin_parts, base.target("/v1/x"), [], b"{}", Timeouts(5, 5, 5))


def test_with_one_connection_allowed_the_next_request_gets_it_once_released() -> None:
    held = threading.Event()

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            held.wait(10)
            conn.send(raw.json_response())

    up = raw.RawUpstream(script)

    async def main() -> list[int]:
        transport = Connections(max_connections=1)
        try:

            async def one() -> int:
                r = await transport.send(_request(up.url))
                await r.read()
                return r.status

            tasks = [asyncio.ensure_future(one()) for _ in range(3)]
            await wait_until_async(lambda: len(up.requests) == 1, message="one request holds the connection")
            await asyncio.sleep(0)  # and the two others wait for it
            held.set()
            return list(await asyncio.gather(*tasks))  # before: the two waiters timed out
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(main()) == [200, 200, 200]
        assert up.connections == 1  # handed over, not reopened
    finally:
        up.close()


def test_an_idle_connection_to_one_origin_makes_room_for_another() -> None:
    ups = [raw.RawUpstream(raw.answer_json) for _ in range(2)]

    async def main() -> list[int]:
        transport = Connections(max_connections=1)
        try:
            statuses = []
            for up in (*ups, *ups):
                r = await transport.send(_request(up.url))
                await r.read()
                statuses.append(r.status)
            return statuses
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(main()) == [200, 200, 200, 200]
    finally:
        for up in ups:
            up.close()
