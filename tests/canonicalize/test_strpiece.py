"""A changed item parsed as its previous parse with its last member's string replaced:
whenever :func:`canonicalize.strpiece.replaced` answers, its item is the one
``orjson.loads`` gives for the new bytes (and it answers None for bytes that are not
JSON), whatever the escapes, characters, member order and writing of the new bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from canonicalize import strpiece
from canonicalize.strpiece import replaced

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
    return {"a": [1, {"b": "c"}], "z": None, "content": text}


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
def test_a_replaced_string_is_the_parse_of_the_new_bytes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strpiece, "BIG", 16)  # short texts: many shapes of change per second
    monkeypatch.setattr(strpiece, "SHORT", 8)  # and a string longer than 8 characters is a long one
    rng = random.Random(seed)
    answered = refused = 0
    for _ in range(4000):
        text = _text(rng, 200)
        item = _item(rng, text)
        new_item = {**item, "content": _changed(rng, text)}
        if rng.random() < 0.1:
            new_item[next(iter(new_item))] = "other"  # (another member changed too)
        before, after = orjson.dumps(item), _written(rng, new_item)
        pad_a, pad_b = rng.randint(0, 3), rng.randint(0, 3)  # the items sit inside bodies
        old = b"[" * pad_a + before + b"]"
        raw = b"{" * pad_b + after + b"}"
        try:
            want = orjson.loads(after)
        except orjson.JSONDecodeError:
            want = None
        got = replaced(item, old, pad_a, pad_a + len(before), raw, pad_b, pad_b + len(after))
        if got is None:
            refused += 1
            continue
        new, key, (start, end) = got
        assert want is not None, after
        assert key == list(item)[-1] and raw[start] == raw[end - 1] == ord('"')
        assert orjson.loads(raw[start:end]) == new[key]
        assert new == want and list(new) == list(want), after
        assert new is not item and item["content"] == text  # the old parse is not touched
        answered += 1
    assert answered > 300 and refused > 300


def test_only_a_last_string_member_after_the_same_bytes_is_replaced() -> None:
    text = "\n".join(f"line {i}: some words" for i in range(200))
    item = {"role": "system", "content": text}
    old = orjson.dumps(item)

    def of(new: Any, was: Any = item) -> Any:
        before, raw = orjson.dumps(was), orjson.dumps(new)
        return replaced(was, before, 0, len(before), raw, 0, len(raw))

    changed = text.replace("line 150:", "line 150!")
    found = of({"role": "system", "content": changed})
    assert found is not None and found[0] == {"role": "system", "content": changed} and found[1] == "content"
    assert found[2] == (len(b'{"role":"system","content":'), len(old) - 1)  # (the same length)
    assert of({"role": "system", "content": text.upper()}) is not None  # however much of it changed
    assert of({"role": "system", "content": ""}) is not None
    assert of({"role": "user", "content": text}) is None  # another member changed
    assert of({"role": "system", "content": text, "name": "x"}) is None  # a member added after it
    assert of({"role": "system", "content": [{"type": "text", "text": text}]}) is None  # not a string
    first = {"content": text, "role": "system"}
    assert of({"content": changed, "role": "system"}, first) is None  # a long member before the last
    spaced = b'{"role": "system", "content": "x"}'
    assert replaced(item, old, 0, len(old), spaced, 0, len(spaced)) is None  # written otherwise
    early = b'{"role":"system","content":"a","content":"b"}'  # the literal ends before the last quote
    assert replaced(item, old, 0, len(old), early, 0, len(early)) is None
    assert replaced(["a"], b'["a"]', 0, 5, b'["b"]', 0, 5) is None  # not an object
    assert replaced({"n": 1}, b'{"n":1}', 0, 7, b'{"n":2}', 0, 7) is None  # the last member not a string
    ends_short = {"content": [{"type": "text", "text": text}], "role": "system"}
    assert of({"content": [{"type": "text", "text": changed}], "role": "system"}, ends_short) is None


@pytest.mark.parametrize("seed", range(6))
def test_where_two_strings_differ_is_read_from_their_bytes_at_line_boundaries(seed: int) -> None:
    """``alike`` never claims more characters alike than the two strings start and end
    with, cuts at line boundaries, and answers for most changes of a few lines."""
    rng = random.Random(seed)
    answered = 0
    for _ in range(3000):
        text = _text(rng, 300)
        new = _changed(rng, text)
        old = b"xx" + orjson.dumps(text) + b"}"
        style = rng.randrange(3)
        literal = orjson.dumps(new) if style == 0 else json.dumps(new, ensure_ascii=style == 1).encode()
        raw = b"{" * rng.randint(0, 3) + literal + b"}"
        at = len(raw) - 1 - len(literal)  # the new literal's opening quote
        got = strpiece.alike(text, old, 3, len(old) - 2, raw, at + 1, at + len(literal) - 1)
        if got is None:
            continue
        p, s = got
        assert p >= 0 and s >= 0 and p + s <= min(len(text), len(new))
        assert text[:p] == new[:p] and text[len(text) - s :] == new[len(new) - s :], (text, new)
        assert p == 0 or text[p - 1] == "\n"
        assert s == 0 or text[len(text) - s] == "\n"
        answered += 1
    assert answered > 500


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
