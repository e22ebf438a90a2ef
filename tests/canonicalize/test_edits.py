"""edits.render: the one-edit fast path and the member append agree with an Edits round."""

from __future__ import annotations

import random

import orjson
import pytest

from canonicalize.edits import AddMember, Op, SetString, SetValue, render
from canonicalize.jsonspan import Edits, JsonDoc, Path, PathError
from tests.canonicalize.test_jsonspan import _chat_body, _chat_paths


def _through_edits(raw: bytes, ops: list[Op]) -> bytes:
    """What render did before its fast paths: every edit through Edits, then the members appended."""
    edits = Edits(JsonDoc(raw))
    added = []
    for op in ops:
        if isinstance(op, SetString):
            edits.replace_string(op.path, op.text)
        elif isinstance(op, SetValue):
            edits.replace(op.path, op.raw)
        elif isinstance(op, AddMember):
            added.append(op)
    out = edits.apply() if edits else raw
    if not added:
        return out
    end = len(out.rstrip())
    if end == 0 or out[end - 1 : end] != b"}":
        raise ValueError("the body is not a JSON object")
    sep = b"" if out[: end - 1].rstrip().endswith(b"{") else b","
    return out[: end - 1] + sep + b",".join(orjson.dumps(m.key) + b":" + m.raw for m in added) + out[end - 1 :]


def _outcome(fn: object, *args: object) -> bytes | type[Exception]:
    try:
        return fn(*args)  # type: ignore[operator, no-any-return]
    except (KeyError, ValueError) as e:
        return type(e)


@pytest.mark.parametrize("seed", range(150))
def test_one_edit_and_appended_members_as_an_edits_round(seed: int) -> None:
    rng = random.Random(seed)
    raw = _chat_body(rng)
    value = orjson.loads(raw)
    for path in _chat_paths(rng, value):
        edit: Op = SetString(path, 'é "R" \\') if rng.randrange(2) else SetValue(path, b"[1, 2]")
        ops: list[Op] = [edit]
        if rng.randrange(2) and isinstance(value, dict):
            ops.insert(rng.randrange(2), AddMember("stream_options", b'{"include_usage":true}'))
        assert _outcome(render, JsonDoc(raw), ops) == _outcome(_through_edits, raw, ops), (path, ops)


@pytest.mark.parametrize(
    "raw",
    [b"{}", b"{ }", b'{"a":1}', b'{"a":1 \n}\n', b"{\t}", b' {"a":[]}\r\n', b'{"a":{}}'],
)
def test_append_before_the_closing_brace(raw: bytes) -> None:
    ops: list[Op] = [AddMember("k", b"1"), AddMember("s", b'"x"')]
    out = render(JsonDoc(raw), ops)
    assert out == _through_edits(raw, ops)
    assert orjson.loads(out)["k"] == 1


def test_an_absent_path_raises_path_error_and_a_non_object_cannot_take_members() -> None:
    raw = b'{"messages":[{"content":"a"}]}'
    with pytest.raises(PathError):
        render(JsonDoc(raw), [SetString(("messages", 1, "content"), "x")])
    path: Path = ("messages", 0, "content")
    assert render(JsonDoc(raw), [SetString(path, "x")]) == b'{"messages":[{"content":"x"}]}'
    with pytest.raises(ValueError, match="not a JSON object"):
        render(JsonDoc(b"[1]"), [AddMember("k", b"1")])
