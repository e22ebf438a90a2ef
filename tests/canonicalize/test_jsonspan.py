"""jsonspan: byte spans by path and edits spliced into raw bytes.  Assertions compare bytes."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest

from canonicalize.edits import AddMember, DeleteMember, Op, SetMember, SetString, SetValue, render
from canonicalize.jsonspan import EditConflict, Edits, JsonDoc, Member, Path, PathError, moved


def at(raw: bytes, path: Path) -> bytes | None:
    span = JsonDoc(raw).span(path)
    return None if span is None else raw[span[0] : span[1]]


NUMBERS = b'{"a": 0.50, "b":1e5,"c" : -0, "d":123456789012345678901234567890, "s":"x", "e":[0.50,1E+2]}'


def test_numbers_untouched_next_to_an_edit() -> None:
    edits = Edits(JsonDoc(NUMBERS))
    edits.replace_string(("s",), "y")
    assert edits.apply() == NUMBERS.replace(b'"s":"x"', b'"s":"y"')
    assert at(NUMBERS, ("d",)) == b"123456789012345678901234567890"
    assert at(NUMBERS, ("c",)) == b"-0"
    assert at(NUMBERS, ("e", 1)) == b"1E+2"


def test_escapes_inside_and_outside_edited_strings() -> None:
    raw = rb'{"p":"caf\u00e9 a\/b \"q\" c:\\","m":[{"content":"x\u00e9\\\"}]"}],"z":"\/"}'
    assert orjson.loads(at(raw, ("m", 0, "content")) or b"") == 'xé\\"}]'
    edits = Edits(JsonDoc(raw))
    edits.replace_string(("m", 0, "content"), 'é "new" \\ /')
    out = edits.apply()
    assert out == raw.replace(rb'"x\u00e9\\\"}]"', orjson.dumps('é "new" \\ /'))
    assert orjson.loads(out)["p"] == 'café a/b "q" c:\\'


def test_escaped_keys_match_their_decoded_text() -> None:
    raw = rb'{"\u006dodel":"m","a\"b":1,"\/":2}'
    assert at(raw, ("model",)) == b'"m"'
    assert at(raw, ('a"b',)) == b"1"
    assert at(raw, ("/",)) == b"2"
    assert JsonDoc(raw).members(())[0] == Member("model", 1, 14, 17)  # type: ignore[index]


def test_duplicate_keys_last_wins_and_the_other_stays() -> None:
    raw = b'{"model":"a","x":{"k":1},"model":"b","\\u006dodel":"c","y":2}'
    assert at(raw, ("model",)) == b'"c"'
    edits = Edits(JsonDoc(raw))
    edits.replace_string(("model",), "z")
    assert edits.apply() == raw.replace(b'"c"', b'"z"')
    members = JsonDoc(raw).members(())
    assert members is not None
    assert [m.key for m in members] == ["model", "x", "model", "model", "y"]
    edits = Edits(JsonDoc(raw))
    edits.delete_member((), "model")
    assert edits.apply() == b'{"x":{"k":1},"y":2}'


def test_duplicate_found_after_a_confirmed_lookup_of_another_key() -> None:
    raw = b'{"a":1,"b":{"a":5},"a":2}'
    doc = JsonDoc(raw)
    assert at(raw, ("b", "a")) == b"5"
    assert doc.span(("a",)) == (raw.index(b"2"), raw.index(b"2") + 1)


PRETTY = b"""{
  "model" : "m",
  "messages" : [
    {
      "role" : "system",
      "content" : [ { "type" : "text", "text" : "sys [x] {y}" } ]
    },
    { "role" : "user", "content" : [ { "type" : "text", "text" : "a" },
                                     { "type" : "image_url", "image_url" : { "url" : "u" } } ] }
  ],
  "tools" : [ ],
  "opts" : { }
}
"""


def test_pretty_printed_paths_and_edits_keep_whitespace() -> None:
    assert at(PRETTY, ()) == PRETTY.strip()
    assert at(PRETTY, ("messages", 1, "content", 0, "text")) == b'"a"'
    assert at(PRETTY, ("messages", 1, "content", 1, "image_url", "url")) == b'"u"'
    edits = Edits(JsonDoc(PRETTY))
    edits.replace_string(("messages", 0, "content", 0, "text"), "new")
    edits.set_member(("opts",), "k", b"1")
    edits.set_member((), "stream_options", b'{"include_usage":true}')
    edits.replace_items(("tools",), 0, 0, [b'{"t":1}', b"2"])
    out = edits.apply()
    expected = (
        PRETTY.replace(b'"sys [x] {y}"', b'"new"')
        .replace(b'"opts" : { }', b'"opts" : { "k":1}')
        .replace(b'"tools" : [ ]', b'"tools" : [{"t":1},2 ]')
        .replace(b'{ "k":1}\n}', b'{ "k":1}\n,"stream_options":{"include_usage":true}}')
    )
    assert out == expected
    assert orjson.loads(out)["stream_options"] == {"include_usage": True}


def test_strings_with_brackets_quotes_and_backslashes_before_quotes() -> None:
    raw = rb'{"a":"[{\"}","b":"\\","c":["\\\\\"]","}"],"d":{"e":"]}{["}}'
    assert at(raw, ("b",)) == rb'"\\"'
    assert at(raw, ("c", 1)) == b'"}"'
    assert at(raw, ("d", "e")) == b'"]}{["'


def test_unicode_outside_the_bmp() -> None:
    raw = '{"a":"😀 raw","b":"\\ud83d\\ude00","é":1,"c":2}'.encode()
    assert orjson.loads(at(raw, ("b",)) or b"") == "😀"
    assert at(raw, ("é",)) == b"1"
    edits = Edits(JsonDoc(raw))
    edits.replace_string(("c",), "𝄞")
    assert edits.apply() == raw.replace(b'"c":2', '"c":"𝄞"'.encode())


@pytest.mark.parametrize(
    ("raw", "path", "expected"),
    [
        (b"  [1, [2, 3]]  ", (1, 0), b"2"),
        (b'"top"', (), b'"top"'),
        (b" 42 ", (), b"42"),
        (b"[]", (0,), None),
        (b"[1,2]", (-1,), b"2"),
        (b"[1,2]", (-3,), None),
        (b'{"a":1}', (0,), None),
        (b"[1]", ("a",), None),
        (b'{"a":"s"}', ("a", "b"), None),
        (b'{"a":1}', ("a", 0), None),
    ],
)
def test_top_level_values_and_absent_paths(raw: bytes, path: Path, expected: bytes | None) -> None:
    assert at(raw, path) == expected


def test_invalid_paths_raise_key_error() -> None:
    edits = Edits(JsonDoc(b'{"a":[1],"o":{"k":1}}'))
    with pytest.raises(KeyError):
        edits.replace(("b",), b"1")
    with pytest.raises(PathError):
        edits.replace_string(("a", 3), "x")
    with pytest.raises(KeyError):
        edits.delete_member(("o",), "missing")
    with pytest.raises(KeyError):
        edits.set_member(("a",), "k", b"1")  # not an object
    with pytest.raises(KeyError):
        edits.replace_items(("o",), 0, 0, [])
    with pytest.raises(KeyError):
        edits.replace_items(("a",), 1, 3, [])
    assert not edits


def test_set_member_on_empty_and_non_empty_objects() -> None:
    raw = b'{"e":{},"f":{ "a" : 1 }}'
    edits = Edits(JsonDoc(raw))
    edits.set_member(("e",), "x", b"1")
    edits.set_member(("e",), "y", b"2")
    edits.set_member(("f",), "a", b"3")
    assert edits.apply() == b'{"e":{"x":1,"y":2},"f":{ "a" : 3 }}'


def test_delete_then_insert_in_one_object() -> None:
    raw = b'{"a":1, "b":2}'
    edits = Edits(JsonDoc(raw))
    edits.delete_member((), "a")
    edits.delete_member((), "b")
    edits.set_member((), "c", b"3")
    assert edits.apply() == b'{"c":3}'
    for key, expected in [("a", b'{"b":2}'), ("b", b'{"a":1}')]:
        edits = Edits(JsonDoc(raw))
        edits.delete_member((), key)
        assert edits.apply() == expected


@pytest.mark.parametrize(
    ("start", "stop", "new", "expected"),
    [
        (0, 0, [], b"[1, 2 ,3]"),
        (0, 0, [b"0"], b"[0,1, 2 ,3]"),
        (3, 3, [b"4", b"5"], b"[1, 2 ,3,4,5]"),
        (1, 2, [b'"x"'], b'[1, "x" ,3]'),
        (0, 2, [], b"[3]"),
        (1, 3, [], b"[1]"),
        (0, 3, [], b"[]"),
        (0, 1, [b"7", b"8"], b"[7,8, 2 ,3]"),
    ],
)
def test_replace_items(start: int, stop: int, new: list[bytes], expected: bytes) -> None:
    edits = Edits(JsonDoc(b"[1, 2 ,3]"))
    edits.replace_items((), start, stop, new)
    assert edits.apply() == expected


def test_replace_items_on_an_empty_array_and_a_fork_of_system_messages() -> None:
    edits = Edits(JsonDoc(b"[ ]"))
    edits.replace_items((), 0, 0, [b"1"])
    assert edits.apply() == b"[1 ]"
    raw = b'{"messages":[{"role":"system","content":"fork"},{"role":"user","content":"u"}]}'
    parent = [b'{"role":"system","content":"p1"}', b'{"role":"system","content":"p2"}']
    edits = Edits(JsonDoc(raw))
    edits.replace_items(("messages",), 0, 1, parent)
    out = edits.apply()
    assert out == b'{"messages":[' + b",".join(parent) + b',{"role":"user","content":"u"}]}'


def test_later_structural_replacement_supersedes_earlier_fine_edits() -> None:
    raw = b'{"tools":[{"description":"a"},{"description":"b"}],"x":1}'
    edits = Edits(JsonDoc(raw))
    edits.replace_string(("tools", 0, "description"), "A")
    edits.replace(("tools",), b"[]")
    edits.replace(("x",), b"2")
    assert edits.apply() == b'{"tools":[],"x":2}'


def test_edit_inside_an_earlier_edit_or_a_partial_overlap_conflicts() -> None:
    raw = b'{"tools":[{"description":"a"}],"x":[1,2,3]}'
    edits = Edits(JsonDoc(raw))
    edits.replace(("tools",), b"[]")
    edits.replace_string(("tools", 0, "description"), "A")
    with pytest.raises(EditConflict):
        edits.apply()
    edits = Edits(JsonDoc(raw))
    edits.replace_items(("x",), 0, 2, [])  # [1,2, : up to the start of 3
    edits.replace_items(("x",), 2, 3, [])  # ,3 : from the end of 2
    with pytest.raises(EditConflict):
        edits.apply()


def test_equal_ranges_later_wins_and_insertions_keep_their_order() -> None:
    raw = b"[1,2]"
    edits = Edits(JsonDoc(raw))
    edits.replace((0,), b"8")
    edits.replace((0,), b"9")
    edits.replace_items((), 2, 2, [b"3"])
    edits.replace_items((), 2, 2, [b"4"])
    assert edits.apply() == b"[9,2,3,4]"


def test_no_edits_returns_the_same_bytes() -> None:
    edits = Edits(JsonDoc(PRETTY))
    assert not edits
    assert edits.apply() == PRETTY


def test_deeper_than_one_regex_call() -> None:
    deep = b"[" * 40 + b'"]"' + b"]" * 40
    raw = b'{"d":' + deep + b',"k":"v"}'
    assert at(raw, ("k",)) == b'"v"'
    assert at(raw, ("d",)) == deep


# -- property test: a seeded random generator with random formatting and escapes ------------

_CHARS = 'aZ09 _-"\\/[]{},:\né\x01😀'


def _ws(rng: random.Random) -> str:
    return rng.choice(["", "", "", " ", "\n  ", "\t", "\r\n "])


def _char(rng: random.Random, c: str) -> str:
    if c == '"':
        return rng.choice(['\\"', "\\u0022"])
    if c == "\\":
        return rng.choice(["\\\\", "\\u005C", "\\u005c"])
    if c == "/":
        return rng.choice(["/", "\\/"])
    if c == "\n":
        return rng.choice(["\\n", "\\u000a"])
    if c == "\x01":
        return "\\u0001"
    if ord(c) > 0xFFFF:
        hi, lo = divmod(ord(c) - 0x10000, 0x400)
        return rng.choice([c, f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04X}"])
    return rng.choice([c] * 5 + [f"\\u{ord(c):04x}"])


def _string(rng: random.Random, text: str) -> str:
    return '"' + "".join(_char(rng, c) for c in text) + '"'


def _value(rng: random.Random, depth: int) -> str:
    kind = rng.randrange(8 if depth < 4 else 4)
    if kind == 0:
        return rng.choice(["0.50", "1e5", "-0", "12345678901234567", "-1.5E-3", "0"])
    if kind == 1:
        return rng.choice(["true", "false", "null"])
    if kind in (2, 3):
        return _string(rng, "".join(rng.choice(_CHARS) for _ in range(rng.randrange(6))))
    if kind in (4, 5):
        items = [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return "[" + _ws(rng) + ("," + _ws(rng)).join(f"{v}{_ws(rng)}" for v in items) + "]"
    keys = [rng.choice(["a", "b", "model", "k/", 'q"', "é", "content"]) for _ in range(rng.randrange(5))]
    members = [f"{_string(rng, k)}{_ws(rng)}:{_ws(rng)}{_value(rng, depth + 1)}{_ws(rng)}" for k in keys]
    return "{" + _ws(rng) + ("," + _ws(rng)).join(members) + "}"


def _paths(value: Any, path: Path = ()) -> list[Path]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            out += _paths(v, (*path, j))
    return out


def _get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _unrelated(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] != b[:n]


CASES = range(500)


@pytest.mark.parametrize("seed", CASES)
def test_random_documents(seed: int) -> None:
    rng = random.Random(seed)
    raw = (_ws(rng) + _value(rng, 0) + _ws(rng)).encode()
    value = orjson.loads(raw)
    doc = JsonDoc(raw)
    paths = _paths(value)
    for path in rng.sample(paths, min(len(paths), 8)):
        span = doc.span(path)
        assert span is not None, path
        assert orjson.dumps(orjson.loads(raw[span[0] : span[1]])) == orjson.dumps(_get(value, path))
        assert doc.span((*path, "absent")) is None
        assert doc.span((*path, 99)) is None
    _random_edits(rng, raw, value, paths)


def _random_edits(rng: random.Random, raw: bytes, value: Any, paths: list[Path]) -> None:
    doc = JsonDoc(raw)
    edits = Edits(doc)
    expected = orjson.loads(raw)
    targets: list[Path] = []
    regions: list[tuple[int, int]] = []
    for path in rng.sample(paths, min(len(paths), 4)):
        node = _get(value, path)
        key = rng.choice(["a", "new", "é", "k/"])
        kind = rng.randrange(3)
        if isinstance(node, dict) and kind == 2 and key not in node:
            kind = 1
        kind = kind if isinstance(node, (dict, list)) else 0
        target = (*path, key) if isinstance(node, dict) and kind else path
        if not all(_unrelated(target, t) for t in targets) or not (kind or path):
            continue
        parent = _get(expected, path)
        if isinstance(node, dict) and kind == 1:
            edits.set_member(path, key, b'"set"')
            parent[key] = "set"
        elif isinstance(node, dict) and kind == 2:
            edits.delete_member(path, key)
            del parent[key]
        elif isinstance(node, list) and kind:
            start = rng.randrange(len(node) + 1)
            stop = rng.randrange(start, len(node) + 1)
            new = [rng.choice([b"1", b'"n"', b"[]"]) for _ in range(rng.randrange(3))]
            edits.replace_items(path, start, stop, new)
            parent[start:stop] = [orjson.loads(b) for b in new]
        else:
            edits.replace_string(path, 'R\\"')
            _get(expected, path[:-1])[path[-1]] = 'R\\"'
        targets.append(target)
        span = doc.span(path)
        assert span is not None
        regions.append(span)
    out = edits.apply()
    expected = expected if targets else value
    assert orjson.dumps(orjson.loads(out), option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        expected, option=orjson.OPT_SORT_KEYS
    )
    _assert_outside_untouched(raw, out, regions)


def _assert_outside_untouched(raw: bytes, out: bytes, regions: list[tuple[int, int]]) -> None:
    """Every byte outside the edited values/containers reaches ``out`` unchanged and in order."""
    merged: list[list[int]] = []
    for a, b in sorted(regions):
        if merged and a < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    pos, cut = 0, 0
    for a, b in merged:
        gap = raw[cut:a]
        found = out.find(gap, pos)
        assert found >= pos if cut else found == 0, (gap, out)
        pos, cut = found + len(gap), b
    assert out.endswith(raw[cut:]) and len(out) - len(raw[cut:]) >= pos


# -- the fast paths against the exact one -------------------------------------------------------
# The exact path proves each top-level key the last of its name before descending
# (JsonDoc._walk); span() first tries _quick_span (the first top-level member, proven
# afterwards from the deepest point reached), then _locate_unproven (the same with the
# cached _Nodes).  Documents like a chat body: duplicate and escaped top-level keys,
# whitespace, escapes in strings, and long strings that put later members beyond _NEAR.


def _exact(raw: bytes, path: Path) -> tuple[int, int] | None:
    doc = JsonDoc(raw)
    found = doc._walk(path)
    if found is None:
        return None
    node, j = found
    return doc._root if node is None else (node.vs[j], doc._end_of(node, j))


_TEXT = 'ab "messages" \\ \n/é\x01'


def _plain_or_escaped(rng: random.Random, text: str) -> str:
    """Mostly as an encoder writes it; sometimes with random escapes (``\\u0061`` for ``a``, ...)."""
    return _string(rng, text) if rng.randrange(5) == 0 else orjson.dumps(text).decode()


def _long_string(rng: random.Random) -> str:
    n = rng.choice([0, 3, 40, 900, 3000])
    return _plain_or_escaped(rng, "".join(rng.choice(_TEXT) for _ in range(n)))


def _message(rng: random.Random) -> str:
    keys = rng.choice([["role", "content"], ["content", "role", "content"], ["role"], ["content", "x"]])
    values = {"role": lambda: _plain_or_escaped(rng, "system"), "content": lambda: _long_string(rng)}
    members = []
    for k in keys:
        value = values.get(k, lambda: _value(rng, 2))() if rng.randrange(6) else _value(rng, 2)
        members.append(f"{_ws(rng)}{_plain_or_escaped(rng, k)}{_ws(rng)}:{_ws(rng)}{value}{_ws(rng)}")
    return "{" + ",".join(members) + "}"


def _chat_body(rng: random.Random) -> bytes:
    keys = rng.choice(
        [
            ["model", "messages", "tools"],
            ["messages"],
            ["model", "messages", "tools", "messages"],
            ["messages", "x", "messages", "y"],
            ["tools", "model"],
            ["model", "pad", "messages"],
        ]
    )
    members = []
    for k in keys:
        if k == "messages":
            items = [_message(rng) if rng.randrange(5) else _value(rng, 1) for _ in range(rng.randrange(4))]
            value = "[" + _ws(rng) + ("," + _ws(rng)).join(items) + _ws(rng) + "]"
        elif k == "pad":
            value = _string(rng, "p" * 3000)
        else:
            value = rng.choice([_long_string(rng), _value(rng, 1)])
        members.append(f"{_ws(rng)}{_plain_or_escaped(rng, k)}{_ws(rng)}:{_ws(rng)}{value}{_ws(rng)}")
    return ("{" + ",".join(members) + "}" + _ws(rng)).encode()


def _chat_paths(rng: random.Random, value: Any) -> list[Path]:
    paths = rng.sample(_paths(value), min(len(_paths(value)), 10))
    return [
        *paths,
        ("messages", 0, "content"),
        ("messages", 1, "content"),
        ("messages", -1, "content"),
        ("messages", 0),
        ("messages", 7),
        ("messages", 0, "absent"),
        ("messages",),
        ("absent", 0),
        ("model",),
    ]


@pytest.mark.parametrize("seed", range(300))
def test_fast_paths_agree_with_the_exact_path(seed: int) -> None:
    rng = random.Random(seed)
    raw = _chat_body(rng)
    value = orjson.loads(raw)
    for path in _chat_paths(rng, value):
        exact = _exact(raw, path)
        quick = JsonDoc(raw)._quick_span(path) if path and isinstance(path[0], str) else None
        assert quick is None or quick == exact, path
        assert JsonDoc(raw)._exact_span(path) == exact, path
        assert JsonDoc(raw).span(path) == exact, path
        if exact is not None:
            assert orjson.dumps(orjson.loads(raw[exact[0] : exact[1]])) == orjson.dumps(_get(value, path))


def test_the_quick_path_is_exercised() -> None:
    """Not vacuous: the random bodies often have messages[0].content and the quick path often proves it
    (not always: an escaped spelling of a key character anywhere later, a later duplicate, ... answer "maybe")."""
    answered = 0
    for seed in range(400):
        raw = _chat_body(random.Random(seed))
        answered += JsonDoc(raw)._quick_span(("messages", 0, "content")) is not None
    assert answered >= 25


def test_a_later_duplicate_of_the_top_level_key_wins_on_every_path() -> None:
    system = '{"role":"system","content":"' + "s" * 5000 + '"}'
    for later in (b'"messages"', b'"\\u006dessages"', b'"messag\\u0065s"', b' "messages" '):
        raw = b'{"model":"m","messages":[' + system.encode() + b'],"t":[1],' + later + b':[{"content":"last"}]}'
        expected = (raw.index(b'"last"'), raw.index(b'"last"') + 6)
        assert JsonDoc(raw)._quick_span(("messages", 0, "content")) is None
        assert JsonDoc(raw).span(("messages", 0, "content")) == expected
        doc = JsonDoc(raw)
        assert doc.span(("messages", 0, "content")) == doc.span(("messages", 0, "content")) == expected


def test_key_text_inside_strings_and_escapes_elsewhere_do_not_hide_the_answer() -> None:
    raw = (
        b'{"model":"m","messages":[{"role":"system","content":"a \\"messages\\": \\u0041"}],'
        b'"tools":[{"d":"\\"messages\\" \\u006d \\\\u0073"}]}'
    )
    span = JsonDoc(raw).span(("messages", 0, "content"))
    assert span == _exact(raw, ("messages", 0, "content"))
    assert span is not None and orjson.loads(raw[span[0] : span[1]]) == 'a "messages": A'


@pytest.mark.parametrize("seed", range(200))
def test_occurs_and_escaped_after_agree_with_a_plain_search(seed: int) -> None:
    rng = random.Random(seed)
    parts = ['"', "m", "messages", '"messages"', "\\u00", "\\u006d", "\\", "x", "\\/"]
    raw = "".join(rng.choice(parts) for _ in range(300))
    doc = JsonDoc(raw.encode())  # not JSON, but these two only search the raw bytes
    for pos in sorted(rng.sample(range(len(raw) + 1), 8), reverse=rng.random() < 0.5):
        for key in ("messages", "m", "a/b"):
            needle = orjson.dumps(key)
            assert doc._occurs(needle, pos) == (doc.raw.find(needle, pos) >= 0)
            escaped = any(
                m.start() >= pos and chr(int(m.group(1), 16)) in key
                for m in re.finditer(rb"\\u00([0-7][0-9a-fA-F])", doc.raw)
            )
            assert doc._escaped_after(key, pos) == escaped, (key, pos)


@pytest.mark.parametrize(
    ("raw", "root"),
    [(b"{}", (0, 2)), (b" \n{} \t", (2, 4)), (b"1", (0, 1)), (b"[1]\r\n", (0, 3))],
)
def test_the_root_span_without_surrounding_whitespace(raw: bytes, root: tuple[int, int]) -> None:
    assert JsonDoc(raw).span(()) == root


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t"])
def test_an_empty_document_is_malformed(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed"):
        JsonDoc(raw)


def test_keys_that_need_escapes_are_compared_decoded() -> None:
    backslash, backspace = "a\\b", "a\b"  # JSON writes them "a\\b" and "a\b": the second's raw text is the first
    raw = b'{"o":{"a\\b":1,"a\\\\b":2},"a\\b":[3],"a\\\\b":[4]}'
    assert orjson.loads(raw) == {"o": {backspace: 1, backslash: 2}, backspace: [3], backslash: [4]}
    for key, value in ((backspace, 1), (backslash, 2)):
        assert orjson.loads(at(raw, ("o", key)) or b"") == value
        assert orjson.loads(at(raw, (key, 0)) or b"") == value + 2
    assert JsonDoc(raw)._quick_span(("o", backslash)) is None


def test_member_start_is_the_kept_members_value_or_unproven() -> None:
    """Where the top-level member's value starts, proven by no later spelling of its key;
    an earlier duplicate, a nested look-alike or a later mention is never taken for it."""
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[]}'
    assert JsonDoc(raw).member_start("messages") == raw.index(b"[")
    assert JsonDoc(raw).member_start("absent") is None
    dup = b'{"messages":[1],"x":{"messages":[2]},"messages":[3]}'
    assert JsonDoc(dup).member_start("messages") is None  # the first one is not the kept one
    later = b'{"messages":[{"role":"user","content":"x"}],"meta":"messages"}'
    assert JsonDoc(later).member_start("messages") is None  # "messages" later: not proven
    nested = b'{"meta":{"messages":[0]},"messages":[1]}'
    assert JsonDoc(nested).member_start("messages") == nested.rindex(b"[1]")
    escaped = b'{"m\\u0065ssages":[1],"messages":[2]}'
    assert JsonDoc(escaped).member_start("messages") is None


@pytest.mark.parametrize("seed", range(300))
def test_a_top_level_member_found_from_the_end_is_the_exact_paths(seed: int) -> None:
    """_tail_span answers the member the exact path finds, or nothing."""
    rng = random.Random(seed)
    raw = _chat_body(rng)
    for key in ("tools", "model", "messages", "x", "y", "absent"):
        found = JsonDoc(raw)._tail_span(key)
        assert found is None or found == _exact(raw, (key,)), key


def test_a_member_after_a_long_array_is_found_from_the_end() -> None:
    messages = b"[" + b",".join(b'{"role":"user","content":"%d"}' % i for i in range(500)) + b"]"
    raw = b'{"model":"m","messages":' + messages + b',"tools":[{"tools":1}] , "t":0.5 }'
    doc = JsonDoc(raw)
    assert doc._tail_span("tools") == (raw.index(b'[{"tools'), raw.index(b"] ,") + 1)  # not the nested "tools"
    assert doc.span(("tools",)) == _exact(raw, ("tools",))
    assert doc._nodes == {}  # the messages array was never stepped over
    later = raw[:-1] + b',"t\\u006fols":2}'  # a later, escaped spelling: that one is the member
    assert JsonDoc(later)._tail_span("tools") is None
    assert JsonDoc(later).span(("tools",)) == _exact(later, ("tools",))
    nested = b'{"a":{"tools":[1]},"b":2}'
    assert JsonDoc(nested)._tail_span("tools") is None and JsonDoc(nested).span(("tools",)) is None


# -- a document moved through string edits (canonicalize.jsonspan.moved) --------------------------
# The bytes a request is forwarded with are its own with some strings replaced (a pin, a
# stripped counter) and members appended (stream_options): their spans are the request's,
# moved.  Compared with a fresh document of the forwarded bytes, on every path.


def _strings(value: Any) -> list[Path]:
    return [p for p in _paths(value) if isinstance(_get(value, p), str)]


@pytest.mark.parametrize("seed", range(300))
def test_a_moved_document_has_the_spans_of_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    raw = _chat_body(rng)
    value = orjson.loads(raw)
    doc = JsonDoc(raw)
    strings = [p for p in _strings(value) if doc.span(p) is not None]  # (a key's earlier duplicate: not a path)
    ops: list[Op] = [
        SetString(p, rng.choice(["", "x", 'q"\\ é', "y" * 900]))
        for p in rng.sample(strings, min(len(strings), rng.randrange(4)))
    ]
    if rng.randrange(2):
        key = rng.choice(["stream_options", "model", "messages", "tools"])  # (a key it has: the appended one counts)
        ops.append(AddMember(key, rng.choice([b"1", b'{"include_usage":true}', b'"s"'])))
    forwarded = render(doc, ops)
    spans = [s for op in ops if isinstance(op, SetString) and (s := doc.span(op.path)) is not None]
    found = moved(JsonDoc(raw), forwarded, spans)
    if not (raw.strip() == b"{}" and len(ops) > len(spans)):  # (a member added to {} has no comma before it)
        assert found is not None
    if found is None:
        return
    after = orjson.loads(forwarded)
    for path in [*_paths(after), *_chat_paths(rng, after), ("absent",), ("messages", 0, "content", 1)]:
        assert found.span(path) == _exact(forwarded, path), path


@pytest.mark.parametrize("seed", range(200))
def test_a_document_edited_otherwise_is_not_moved(seed: int) -> None:
    """A value that is not a string replaced, a member set or removed: no proof (the bytes
    outside the strings differ), or, where the edit left the bytes as they were, the spans
    are still the fresh document's."""
    rng = random.Random(seed)
    raw = _chat_body(rng)
    value = orjson.loads(raw)
    doc = JsonDoc(raw)
    paths = [p for p in _paths(value) if p and doc.span(p) is not None]
    if not paths:
        return
    path = rng.choice(paths)
    parent = path[:-1]
    ops: list[Op] = rng.choice(
        [
            [SetValue(path, b"[1, 2]")],
            [DeleteMember(parent, path[-1])] if isinstance(path[-1], str) else [SetValue(path, b"0")],
            [SetMember((), "zz", b"0")],
        ]
    )
    try:
        forwarded = render(doc, ops)
    except (KeyError, ValueError):
        return
    spans = [s for p in _strings(value) if (s := doc.span(p)) is not None]
    found = moved(JsonDoc(raw), forwarded, spans)
    if found is None:
        return
    after = orjson.loads(forwarded)
    for path in [*_paths(after), ("absent",)]:
        assert found.span(path) == _exact(forwarded, path), path


def test_moved_spans_are_found_in_the_origin() -> None:
    """What the origin located is not looked for again, and what is located through the
    moved document stays with the origin (its conversation's next body carries it)."""
    system = '{"role":"system","content":"Now: 10:41. ' + "s" * 5000 + '"}'
    raw = ('{"model":"m","messages":[' + system + ',{"role":"user","content":"hi"}],"tools":[{"a":1}]}').encode()
    doc = JsonDoc(raw)
    edit = SetString(("messages", 0, "content"), "Now: <pinned>. " + "s" * 5000)
    forwarded = render(doc, [edit, AddMember("stream_options", b'{"include_usage":true}')])
    found = moved(doc, forwarded, [doc.span(edit.path)])  # type: ignore[list-item]
    assert found is not None and found.appended == {"stream_options"}
    assert found.span(("tools",)) == _exact(forwarded, ("tools",))
    assert ("tools",) in doc._quick and found._quick == {} and found._nodes == {}  # located once, in the origin
    assert found.span(("messages", 0)) == _exact(forwarded, ("messages", 0))
    assert found.span(("stream_options",)) == _exact(forwarded, ("stream_options",))
    other = forwarded.replace(b'"m"', b'"n"')  # a byte outside the strings: no proof
    assert moved(doc, other, [doc.span(edit.path)]) is None  # type: ignore[list-item]


@pytest.mark.parametrize("seed", range(200))
def test_lookups_on_one_document_in_any_order_agree_with_the_exact_path(seed: int) -> None:
    """One document answers many lookups (the array walks and the proofs it keeps are
    reused): in any order, each is the exact path's answer."""
    rng = random.Random(seed)
    raw = _chat_body(rng)
    value = orjson.loads(raw)
    n = len(value["messages"]) if isinstance(value, dict) and isinstance(value.get("messages"), list) else 3
    paths = (
        _chat_paths(rng, value)
        + [("messages", i) for i in range(n + 1)]
        + [("messages", i, "content") for i in range(n)]
    )
    rng.shuffle(paths)
    doc = JsonDoc(raw)
    for path in paths:
        assert doc.span(path) == _exact(raw, path), path


def _calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """``owner.name`` wrapped to count its calls, in the list returned (one item)."""
    calls = [0]
    real = getattr(owner, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_looking_up_each_item_of_an_array_in_turn_is_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record's system part of n system messages, or n edits, looks up n items: each
    lookup goes on from the last item reached, so the values stepped over grow with n,
    not n squared (4,000 system messages took seconds on the event loop)."""
    stepped = _calls(monkeypatch, JsonDoc, "_value_end")
    for n in (100, 1000):
        msgs = [{"role": "system", "content": f"rule {i}"} for i in range(n)] + [{"role": "user", "content": "hi"}]
        raw = orjson.dumps({"model": "m", "messages": msgs, "tools": []})
        doc, stepped[0] = JsonDoc(raw), 0
        spans = [doc.span(("messages", i)) for i in range(n)]
        assert stepped[0] <= 4 * n, (n, stepped)  # (before: ~n * n / 2)
        assert spans == [_exact(raw, ("messages", i)) for i in range(n)]


@pytest.mark.parametrize("seed", range(200))
def test_edits_inside_later_ones_are_dropped_as_one_comparison_of_all_pairs_would(seed: int) -> None:
    """``apply`` compares an edit only with those its range can lie in: the same edits
    kept as comparing every pair keeps them."""
    from canonicalize.jsonspan import _Edit, _inside, _outermost

    rng = random.Random(seed)
    edits = []
    for seq in range(rng.randrange(1, 40)):
        start = rng.randrange(0, 60)
        end = start + rng.choice((0, 0, 1, 2, 5, 20))
        edits.append(_Edit(start, end, b"x", seq))
    rng.shuffle(edits)
    naive = [e for e in edits if not any(f.seq > e.seq and _inside(e, f) for f in edits)]
    assert sorted(_outermost(edits)) == sorted(naive)


def test_thousands_of_separate_edits_are_not_compared_pair_by_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pinned value restored in each of 2,000 system messages: 2,000 edits, none inside
    another, so none is compared with another (it took seconds pair by pair)."""
    import canonicalize.jsonspan as jsonspan

    compared = _calls(monkeypatch, jsonspan, "_inside")
    msgs = [{"role": "system", "content": f"checked at 10:0{i % 10}"} for i in range(2000)]
    raw = orjson.dumps({"model": "m", "messages": msgs})
    edits = Edits(JsonDoc(raw))
    for i in range(2000):
        edits.replace_string(("messages", i, "content"), "checked at 10:00")
    out = edits.apply()
    assert compared == [0]
    assert orjson.loads(out)["messages"] == [{"role": "system", "content": "checked at 10:00"}] * 2000
