"""proxy.addons.Runner: the counting hooks run right after the hooks of the moment
after the last byte, in the request's task (proxy.addons.counting); /metrics waits
for the requests being counted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from starlette.datastructures import Headers
from starlette.testclient import TestClient

from canonicalize import CHAT
from proxy.addons import Runner
from proxy.app import create_app
from proxy.config import load
from proxy.flow import Flow, Inbound
from proxy.metrics import Metrics


class _Hook:
    def __init__(self, name: str, log: list[tuple[str, int]], *, when: str, pause: asyncio.Event | None = None) -> None:
        self.name = name
        self.log = log
        self.needs: tuple[type, ...] = ()
        self.when = when
        self.pause = pause

    async def done(self, flow: Flow) -> None:
        if self.pause is not None:
            await self.pause.wait()
        self.log.append((self.name, int(flow.inbound.query)))


def _runner(log: list[tuple[str, int]], pause: asyncio.Event | None = None) -> Runner:
    hooks: Any = (_Hook("measure", log, when="counted", pause=pause), _Hook("record", log, when="after_last_byte"))
    return Runner(hooks, Metrics(["m"], 4))


def _flow(n: int) -> Flow:
    return Flow(Inbound(CHAT, "/v1/chat/completions", str(n).encode(), Headers(), b"{}", time.perf_counter()))


def test_the_counting_runs_right_after_the_record_in_the_order_the_responses_ended() -> None:
    log: list[tuple[str, int]] = []
    runner = _runner(log)

    async def go() -> None:
        flow = _flow(1)
        await runner.after_last(flow)
        ended = flow.answer.ended
        await runner.after_last(_flow(2))
        assert log == [("record", 1), ("measure", 1), ("record", 2), ("measure", 2)]
        assert runner.counting.busy == 0
        await runner.counting.flushed()  # nothing being counted: at once
        assert flow.answer.ended == ended  # the duration counted ends at the response, not at the count
        await runner.counting.close()

    asyncio.run(go())


def test_flushed_waits_for_a_request_being_counted() -> None:
    log: list[tuple[str, int]] = []

    async def go() -> None:
        pause = asyncio.Event()
        runner = _runner(log, pause)
        counting = asyncio.create_task(runner.after_last(_flow(1)))
        while runner.counting.busy == 0:
            await asyncio.sleep(0)
        flushed = asyncio.create_task(runner.counting.flushed())
        await asyncio.sleep(0)
        assert not flushed.done() and ("measure", 1) not in log
        pause.set()
        await flushed
        assert ("measure", 1) in log
        await counting
        await runner.counting.close()

    asyncio.run(go())


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
