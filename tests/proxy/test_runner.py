"""proxy.addons.Runner: done hooks that only count run off the next request's
critical path (one queue, one task: proxy.addons.counting), and are never lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from starlette.datastructures import Headers
from starlette.testclient import TestClient

from canonicalize import CHAT, JsonDoc
from proxy.addons import Runner
from proxy.addons.counting import DRAIN_S
from proxy.app import create_app
from proxy.config import load
from proxy.flow import Flow, Inbound, Parsed
from proxy.metrics import Metrics


class _Hook:
    def __init__(self, name: str, log: list[tuple[str, int]], *, when: str) -> None:
        self.name = name
        self.log = log
        self.needs: tuple[type, ...] = ()
        self.when = when

    async def done(self, flow: Flow) -> None:
        self.log.append((self.name, int(flow.inbound.query)))


def _runner(log: list[tuple[str, int]]) -> Runner:
    hooks: Any = (_Hook("measure", log, when="counted"), _Hook("record", log, when="after_last_byte"))
    return Runner(hooks, Metrics(["m"], 4))


def _flow(n: int) -> Flow:
    return Flow(Inbound(CHAT, "/v1/chat/completions", str(n).encode(), Headers(), b"{}", time.perf_counter()))


def test_the_record_runs_at_the_response_end_and_the_counting_waits_for_its_task() -> None:
    log: list[tuple[str, int]] = []
    runner = _runner(log)

    async def go() -> None:
        await runner.after_last(_flow(1))
        await runner.after_last(_flow(2))
        assert log == [("record", 1), ("record", 2)]
        await runner.counting.flushed()
        assert log[2:] == [("measure", 1), ("measure", 2)]  # in the order the responses ended
        await runner.counting.flushed()  # nothing twice
        assert len(log) == 4
        await runner.after_last(_flow(3))
        runner.counting.kick()  # a request went upstream: counted at the loop's next turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert log[4:] == [("record", 3), ("measure", 3)]
        await runner.counting.close()

    asyncio.run(go())


def test_the_counting_runs_within_drain_s_when_nothing_drains_it() -> None:
    log: list[tuple[str, int]] = []
    runner = _runner(log)

    async def go() -> None:
        flow = _flow(1)
        await runner.after_last(flow)
        ended = flow.answer.ended
        assert ended > 0 and ("measure", 1) not in log
        # Kept on purpose: the claim is a bound (within DRAIN_S), not an event to wait for.
        # This timer is due after the counting's, and the loop fires timers in the order
        # they are due, so the counting's task has run by now, however loaded the machine.
        await asyncio.sleep(DRAIN_S * 4)
        assert ("measure", 1) in log and not runner.counting.pending
        assert flow.answer.ended == ended  # the duration counted ends at the response, not at the count
        await runner.counting.close()

    asyncio.run(go())


def test_a_counted_flow_is_freed_once_counted() -> None:
    """The queue keeps a flow (and the parse it holds) until it is counted, not until
    the task next wakes: a body held past its response is memory the next requests
    would have reused."""
    import gc
    import weakref

    class Body(dict[str, Any]):  # a parse the flow holds (a dict subclass can be weakly referenced)
        pass

    log: list[tuple[str, int]] = []
    runner = _runner(log)

    async def go() -> None:
        flow = _flow(1)
        body = Body(model="m")
        flow.decide(Parsed(body, JsonDoc(b"{}")))
        held = weakref.ref(body)
        del body
        await runner.after_last(flow)
        del flow
        gc.collect()
        assert held() is not None  # queued: its counting has not run yet
        await runner.counting.flushed()
        await asyncio.sleep(0)
        assert held() is None, gc.get_referrers(held())
        await runner.counting.close()

    gc.disable()  # freed by reference counting, as in the server, not by a collection
    try:
        asyncio.run(go())
    finally:
        gc.enable()


def test_metrics_answer_with_every_response_counted() -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        reply = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 7},
        }
        return httpx.Response(200, json=reply)

    app = create_app(load(None, env={}), transport=httpx.MockTransport(upstream))
    with TestClient(app) as client:
        for _ in range(3):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        text = client.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("prefixpin_requests_total{"))
    assert line.endswith(" 3.0"), line


def test_a_request_going_upstream_kicks_the_counting_only_when_no_other_waits_on_one() -> None:
    """At one connection the loop is idle while a request waits on its upstream: the
    counting runs then.  When another request already waits, the loop has work, and
    the counting is left to its timer (in batches under load)."""
    import sys
    import threading

    entered, loop_of, gate = threading.Event(), [], []
    calls = 0

    async def upstream(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first request waits until the second is answered
            loop_of.append(asyncio.get_running_loop())
            gate.append(asyncio.Event())
            entered.set()
            await gate[0].wait()
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})

    app = create_app(load(None, env={}), transport=httpx.MockTransport(upstream))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        counting = app.handler.runner.counting if app.handler is not None else None
        assert counting is not None
        kicks: list[int] = []  # the handler's kicks (the timer's are not asked about here)
        real = counting.kick

        def kick() -> None:
            if sys._getframe(1).f_code.co_name == "_forward":
                kicks.append(calls)
            real()

        counting.kick = kick  # type: ignore[method-assign]
        first = threading.Thread(target=lambda: client.post("/v1/chat/completions", json=body))
        first.start()
        assert entered.wait(30)
        assert client.post("/v1/chat/completions", json=body).status_code == 200  # while the first waits
        loop_of[0].call_soon_threadsafe(gate[0].set)
        first.join(30)
    assert kicks == [0]  # the first request's, before its upstream was called; not the second's


def test_the_counting_queue_is_bounded_and_a_flow_past_it_is_counted_as_dropped(caplog: Any) -> None:
    """A counting hook that waits holds the queue: past ``max_pending`` a flow's counting
    is dropped (counted, warned once), the queue keeps what it held, and every flow it
    held is counted once the hook goes on."""
    from prometheus_client import generate_latest

    log: list[tuple[str, int]] = []
    gate = asyncio.Event()

    class Waits(_Hook):
        async def done(self, flow: Flow) -> None:
            await gate.wait()
            await super().done(flow)

    metrics = Metrics(["m"], 4)
    runner = Runner((Waits("measure", log, when="counted"),), metrics)  # type: ignore[arg-type]
    runner.counting.max_pending = 8

    async def go() -> None:
        await runner.after_last(_flow(0))
        runner.counting.kick()
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the task took flow 0 and waits in its hook
        assert not runner.counting.pending
        for n in range(1, 12):
            await runner.after_last(_flow(n))
        assert [int(f.inbound.query) for f in runner.counting.pending] == list(range(1, 9))
        gate.set()
        await runner.counting.flushed()
        assert log == [("measure", n) for n in range(9)]
        await runner.counting.close()

    with caplog.at_level("WARNING", logger="prefixpin"):
        asyncio.run(go())
    text = generate_latest(metrics.registry).decode()
    assert 'prefixpin_fail_open_total{stage="counting"} 3.0' in text
    warned = [r for r in caplog.records if "counting queue is full" in r.getMessage()]
    assert len(warned) == 1, warned
