"""proxy.through: a stream's pieces through the reply machine, and the two bounds past
which it stops reading and lets the rest pass as it comes (fail open, counted)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.datastructures import Headers

from canonicalize import CHAT
from proxy.flow import Flow, Inbound
from proxy.metrics import Metrics
from proxy.relay import AsSent, HeldHead
from proxy.through import Through

EVENT = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def _through(*, max_event: int = 1000, max_read: int = 1 << 20, held: HeldHead | None = None) -> Through:
    flow = Flow(Inbound(CHAT, "", b"", Headers(), b"{}", 0.0))
    flow.answer.reply = CHAT.reply(offered=None, drop_usage_chunk=False)
    return Through(Metrics(), flow, 0.0, max_event_bytes=max_event, max_decoded_bytes=max_read, held=held)


def _decode_fail_opens(t: Through) -> float | None:
    return t.metrics.registry.get_sample_value("prefixpin_fail_open_total", {"stage": "decode"})


def test_events_go_through_and_the_reply_is_read() -> None:
    t = _through()
    out = t.feed(EVENT[:30]) + t.feed(EVENT[30:] + EVENT) + t.end()
    assert out == EVENT * 2
    assert t.flow.answer.reply is not None and t.flow.answer.reply.message() == {"role": "assistant", "content": "hihi"}


def test_an_event_past_the_bound_lets_the_rest_pass_as_it_comes() -> None:
    t = _through(max_event=1000)
    line = b"data: " + b"x" * 600
    pieces = [EVENT, line, line, line, b"\n\n", EVENT]
    out = b"".join(t.feed(p) for p in pieces) + t.end()
    assert out == b"".join(pieces)  # every byte, in order
    assert t.flow.answer.reply is None and t.splitter.held == 0
    assert _decode_fail_opens(t) == 1


def test_a_stream_past_the_read_bound_lets_the_rest_pass() -> None:
    t = _through(max_read=len(EVENT) * 3)
    pieces = [EVENT] * 6
    assert b"".join(t.feed(p) for p in pieces) + t.end() == EVENT * 6
    assert t.flow.answer.reply is None and _decode_fail_opens(t) == 1


def test_before_anything_went_out_a_bound_asks_for_the_answer_as_sent() -> None:
    async def never(message: object) -> None:
        raise AssertionError("nothing is sent")

    held = HeldHead(never, {"type": "http.response.start", "status": 200, "headers": []})
    t = _through(max_event=100, held=held)
    assert t.feed(b"data: " + b"x" * 50) == b""
    with pytest.raises(AsSent):
        t.feed(b"x" * 100)
    assert t.flow.answer.reply is None


def test_a_held_head_goes_out_with_the_first_bytes() -> None:
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    marks: list[str] = []
    start = {"type": "http.response.start", "status": 200, "headers": []}
    held = HeldHead(send, start, on_sent=lambda: marks.append("sent"))

    async def main() -> None:
        await held({"type": "http.response.body", "body": b"", "more_body": True})
        assert sent == [] and not held.sent
        await held({"type": "http.response.body", "body": b"x", "more_body": True})

    asyncio.run(main())
    assert sent == [start, {"type": "http.response.body", "body": b"x", "more_body": True}] and marks == ["sent"]
