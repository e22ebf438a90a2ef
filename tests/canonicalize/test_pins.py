"""canonicalize.pins: a pin is keyed by its line, every pinned span on it masked."""

from __future__ import annotations

from canonicalize import Settings, compile_rule, pins
from canonicalize.wire.base import Slot
from tests.flows import Harness

USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}
CLOCK = compile_rule("clock", r"at (?P<v>\d{2}:\d{2}:\d{2})", "pin")
COUNT = compile_rule("count", r"used (?P<v>\d+)", "pin")


def keys(text: str) -> dict[str, str]:
    return {s.rule.name: s.key for s in pins.find_spans((CLOCK, COUNT), [Slot([text], 0, ())])}


def test_a_key_masks_every_pinned_span_of_its_line() -> None:
    assert keys("at 10:00:00, used 5") == keys("at 10:00:07, used 9")
    assert keys("at 10:00:00, used 5")["clock"] != keys("at 10:00:00, used 5, more")["clock"]  # another line
    assert keys("at 10:00:00\nused 5") == keys("at 10:00:01\nused 6")


def test_two_pins_on_one_line_both_restore() -> None:
    h = Harness(Settings(packs=(), rules=(CLOCK, COUNT)))
    h.send(
        {"model": "m", "messages": [{"role": "system", "content": "Now at 10:00:00, used 5 tokens"}, USER]}, reply=REPLY
    )
    out = h.send(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Now at 10:00:42, used 17 tokens"},
                USER,
                REPLY,
                {"role": "user", "content": "more"},
            ],
        }
    )
    assert out.role == "continuation"
    assert out.body["messages"][0]["content"] == "Now at 10:00:00, used 5 tokens"
    assert out.rewrites == ["clock", "count"]
