"""canonicalize.pins: a pin is keyed by its line, every pinned span on it masked."""

from __future__ import annotations

import pytest
import xxhash

from canonicalize import Settings, compile_rule, pins
from canonicalize.rules import Rule
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


def _reference_spans(rules: tuple[Rule, ...], text: str) -> list[tuple[str, int, int, str, str]]:
    """find_spans as first written (each span's line read and masked on its own):
    quadratic, and the keys recorded pins are stored under; the linear one must agree."""
    found = sorted(((s, e, r) for r in rules for s, e in r.spans(text)), key=lambda f: f[0])
    where = [(s, e) for s, e, _ in found]
    out = []
    for start, end, rule in found:
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        parts, pos = [], line_start
        for s, e in where:
            if s < line_start or e > line_end or s < pos:
                continue
            parts += (text[pos:s], pins.MASK)
            pos = e
        parts.append(text[pos:line_end])
        digest = xxhash.xxh64_hexdigest("".join(parts).encode("utf-8", "surrogatepass"))
        out.append((rule.name, start, end, f"{rule.name}:{digest}", text[start:end]))
    return out


def test_keys_are_the_ones_each_line_read_alone_gives() -> None:
    """Random texts of dates, counters, spans across lines and overlapping rules: the
    same spans and keys as reading each span's line on its own (the stored pins' keys)."""
    import random

    rnd = random.Random(7)
    across = compile_rule("across", r"(?P<v>x\n\d+)", "pin")  # a span that ends on the next line
    overlap = compile_rule("overlap", r"(?P<v>\d{2}:\d{2})", "pin")  # inside CLOCK's spans
    rules = (CLOCK, COUNT, across, overlap)
    words = ["at 10:00:01", "used 7", "x\n12", "\n", " ", "é", "\U0001f600", "at 9", "used", ":", "\n\n", "x"]
    for _ in range(500):
        text = "".join(rnd.choice(words) for _ in range(rnd.randint(0, 40)))
        got = [(s.rule.name, s.start, s.end, s.key, s.value) for s in pins.find_spans(rules, [Slot([text], 0, ())])]
        assert got == _reference_spans(rules, text), text


def test_each_line_is_masked_and_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """30,000 dated lines, or one line of as many dates: each line is hashed once, and
    what is hashed is the text's size, not the spans' count times it (reading every
    span's line with every span took ~40 s for the first, and ~30,000 copies of the
    whole line for the second)."""
    hashed: list[int] = []

    class Counted:
        @staticmethod
        def xxh64_hexdigest(data: bytes) -> str:
            hashed.append(len(data))
            return xxhash.xxh64_hexdigest(data)

    monkeypatch.setattr(pins, "xxhash", Counted)
    lines = "\n".join(f"note {i} at 13:{i % 60:02d}:00" for i in range(30_000))
    one = ", ".join(f"at 13:{i % 60:02d}:00" for i in range(30_000))
    for text, n_lines in ((lines, 30_000), (one, 1)):
        hashed.clear()
        found = pins.find_spans((CLOCK,), [Slot([text], 0, ())])
        assert len(found) == 30_000 and len(hashed) == n_lines and sum(hashed) <= len(text)
    assert len({s.key for s in found}) == 1  # one line: one key
