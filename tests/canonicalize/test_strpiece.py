"""A changed item parsed as its previous parse with a string member's lines replaced:
whenever :func:`canonicalize.strpiece.edited` answers, its item is the one
``orjson.loads`` gives for the new bytes (and it answers None for bytes that are not
JSON), whatever the escapes, characters, member order and writing of the new bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from canonicalize import strpiece
from canonicalize.strpiece import edited

PIECES = ["a", "b", " ", "\n", "\\", '"', "—", "═", "\t", "\x01", "é", "😀", "\\n", "n", "u", "/", "\r", "\u2028"]
BYTES = [b"\\", b'"', b"n", b"\n", b"u", b"0", b"\xe2", b"\x80", b"}", b",", b" ", b"\\n", b"\\\\"]


def _text(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, most)))


def _item(rng: random.Random, text: str) -> dict[str, Any]:
    shape = rng.randrange(4)
    if shape == 0:
        return {"role": "system", "content": text}
    if shape == 1:
        return {"content": text, "role": "system"}
    if shape == 2:
        return {"role": "system", "content": text, "name": "x"}
    return {"a": [1, {"b": "c"}], "content": text, "z": None}


def _changed(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    mode = rng.randrange(5)
    if mode == 0:
        lines[rng.randrange(len(lines))] = _text(rng, 10)
        return "\n".join(lines)
    if mode == 1:
        at = rng.randint(0, len(text))
        return text[:at] + _text(rng, 5) + "x" + text[at:]
    if mode == 2 and text:
        at = rng.randrange(len(text))
        return text[:at] + text[at + rng.randint(1, 5) :]
    if mode == 3:
        lines.insert(rng.randrange(len(lines) + 1), _text(rng, 10))
        return "\n".join(lines)
    return text


def _written(rng: random.Random, item: dict[str, Any]) -> bytes:
    """``item`` as a client may write it: as orjson does, with ASCII escapes, with other
    escapes, or orjson's bytes with a few bytes changed (often no longer JSON)."""
    style = rng.randrange(4)
    if style == 0:
        return orjson.dumps(item)
    if style == 1:
        return json.dumps(item, ensure_ascii=True, separators=(",", ":")).encode()
    if style == 2:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()
    out = bytearray(orjson.dumps(item))
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out) + 1)
        op = rng.randrange(3)
        if op == 0:
            out[at:at] = rng.choice(BYTES)
        elif op == 1 and at < len(out):
            del out[at]
        elif at < len(out):
            out[at : at + 1] = rng.choice(BYTES)
    return bytes(out)


@pytest.mark.parametrize("seed", range(6))
def test_an_edit_is_the_parse_of_the_new_bytes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strpiece, "BIG", 16)  # short texts: many shapes of edit per second
    rng = random.Random(seed)
    answered = refused = 0
    for _ in range(4000):
        text = _text(rng, 200)
        item = _item(rng, text)
        new_item = {**item, "content": _changed(rng, text)}
        before, after = orjson.dumps(item), _written(rng, new_item)
        pad_a, pad_b = rng.randint(0, 3), rng.randint(0, 3)  # the items sit inside bodies
        old = b"[" * pad_a + before + b"]"
        raw = b"{" * pad_b + after + b"}"
        try:
            want = orjson.loads(after)
        except orjson.JSONDecodeError:
            want = None
        got = edited(item, old, pad_a, pad_a + len(before), raw, pad_b, pad_b + len(after))
        if got is None:
            refused += 1
            continue
        new, key, kept_start, kept_end, (start, end) = got
        assert want is not None, after
        assert orjson.loads(raw[start:end]) == new[key] and raw[start] == raw[end - 1] == ord('"')
        assert new == want and list(new) == list(want), after
        assert new is not item and item["content"] == text  # the old parse is not touched
        value, was = new[key], item[key]
        assert value[:kept_start] == was[:kept_start]
        assert value[len(value) - kept_end :] == was[len(was) - kept_end :]
        answered += 1
    assert answered > 300 and refused > 300


def test_only_a_long_string_member_is_parsed_as_an_edit() -> None:
    text = "\n".join(f"line {i}: some words" for i in range(200))
    item = {"role": "system", "content": text}
    old = orjson.dumps(item)

    def of(new: dict[str, Any]) -> Any:
        raw = orjson.dumps(new)
        return edited(item, old, 0, len(old), raw, 0, len(raw))

    found = of({"role": "system", "content": text.replace("line 150:", "line 150!")})
    assert found is not None and found[1:4] == (
        "content",
        text.index("line 150:"),
        len(text) - text.index("\nline 151"),
    )
    assert of({"role": "user", "content": text}) is None  # another member changed
    assert of({"role": "system", "content": text, "name": "x"}) is None  # a member added
    assert of({"role": "system", "content": text}) is None  # nothing changed
    assert of({"role": "system", "content": text.upper()}) is None  # most of it changed
    short = {"role": "system", "content": "one line, changed here"}
    raw = orjson.dumps({"role": "system", "content": "one line, changed there"})
    assert edited(short, orjson.dumps(short), 0, len(orjson.dumps(short)), raw, 0, len(raw)) is None
    assert edited(["a"], b'["a"]', 0, 5, b'["b"]', 0, 5) is None  # not an object


@pytest.mark.parametrize("seed", range(3))
def test_where_two_byte_strings_start_and_end_to_differ(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(4000):
        a = bytes(rng.choice(b"ab") for _ in range(rng.choice([0, 1, 5, 255, 256, 257, 600, 1500, 5000])))
        b = bytearray(a)
        for _ in range(rng.randint(0, 3)):
            if b and rng.random() < 0.7:
                b[rng.randrange(len(b))] = rng.choice(b"abc")
            else:
                at = rng.randint(0, len(b))
                b[at:at] = rng.choice([b"c", b"ab", b""])
        pa, pb = rng.randint(0, 3), rng.randint(0, 3)
        x, y = b"q" * pa + a + b"rr", b"s" * pb + bytes(b) + b"t"
        most = min(len(a), len(b))
        alike = next((i for i in range(most) if a[i] != b[i]), most)
        assert strpiece._prefix(x, pa, y, pb, most) == alike
        for bound in (most, most - alike, rng.randint(0, most)):
            tail = next((i for i in range(bound) if a[len(a) - 1 - i] != b[len(b) - 1 - i]), bound)
            assert strpiece._suffix(x, pa + len(a), y, pb + len(b), bound) == tail


@pytest.mark.parametrize("seed", range(30))
def test_a_canonical_literals_characters_counted_without_reading_them(seed: int) -> None:
    """``_count`` of any run of whole escapes and characters of an orjson literal is
    the length of what it reads as: escapes (runs of backslashes of every length,
    control characters), non-ASCII and ``\\u`` text included."""
    rng = random.Random(seed)
    alphabet = ["a", " ", "\n", "\t", '"', "\\", "\\\\", "\\u", "u", "\x01", "\x1f", "é", "😀", "/", "\\n"]
    if seed % 2:  # ASCII only: counted without being read
        alphabet = [c for c in alphabet if c.isascii()]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    literal = orjson.dumps(text)
    cuts = [1]  # the places between whole escapes and characters of the literal
    for ch in text:
        cuts.append(cuts[-1] + len(orjson.dumps(ch)) - 2)
    for _ in range(20):
        i, j = sorted(rng.randrange(len(cuts)) for _ in range(2))
        a, b = cuts[i], cuts[j]
        assert strpiece._count(literal, a, b) == len(strpiece._chars(literal, a, b)) == j - i
