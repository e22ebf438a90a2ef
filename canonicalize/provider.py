"""The providers' own cache controls, as edits; their cache verdicts, as causes.

- :func:`cache_key`: the ``prompt_cache_key`` of a lineage (OpenAI routes requests
  with one key to one cache machine): a keyed hash of the lineage root id, keyed
  by the tenant, so a lineage and its forks share a key and nobody can guess or
  collide with another tenant's.
- :func:`breakpoints`: Anthropic ``cache_control`` markers at the stable points
  of a ``/v1/messages`` request (the end of system+tools, the newest message
  before the last user turn), as byte-preserving edits; :func:`chat_breakpoints`
  the same on a chat-completions request LiteLLM translates to Anthropic.  The
  first may carry ``"ttl": "1h"`` (``provider_cache.anthropic_ttl``, see
  :mod:`canonicalize.ttl`); the second never does, so no 1-hour breakpoint ever
  follows a 5-minute one (Anthropic rejects that order).
- :func:`diagnostics` / :func:`with_beta`: the member and the ``anthropic-beta``
  value that ask Anthropic why a request missed its cache.
- :func:`place`: breakpoint edits fitted into the edits already decided (a fork's
  recorded system, a lineage's recorded tools[]), for Anthropic's ``cache_control``
  and OpenAI's ``prompt_cache_breakpoint`` (:mod:`canonicalize.openai_cache`) alike.

The providers' verdicts on a miss are :mod:`canonicalize.verdicts`'.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from canonicalize.edits import AddMember, DeleteMember, Op, SetItems, SetMember, SetString, SetValue, render
from canonicalize.jsonspan import JsonDoc, Path

CACHE_CONTROL = "cache_control"  # Anthropic's breakpoint member
EPHEMERAL = b'{"type":"ephemeral"}'
EPHEMERAL_1H = b'{"type":"ephemeral","ttl":"1h"}'
DIAGNOSIS_BETA = "cache-diagnosis-2026-04-07"  # Anthropic's beta for diagnostics.previous_message_id
KEY_PREFIX = "pp-"
MAX_BREAKPOINTS = 4  # Anthropic's limit per request
# Blocks Anthropic refuses a cache_control on (or that are never part of a stable prefix).
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


def cache_key(tenant: str, root_id: str) -> str:
    """``pp-`` + 24 hex: the lineage root ``root_id`` hashed with the tenant as the key."""
    key = hashlib.blake2b(tenant.encode(), digest_size=32).digest()
    digest = hashlib.blake2b(root_id.encode(), key=key, digest_size=12, person=b"prefixpin.pck").hexdigest()
    return KEY_PREFIX + digest


def marker(ttl: str) -> bytes:
    """The ``cache_control`` value of a breakpoint with this TTL (``5m``: Anthropic's default, no ``ttl``)."""
    return EPHEMERAL_1H if ttl == "1h" else EPHEMERAL


def diagnostics(previous_message_id: str) -> bytes:
    """The ``diagnostics`` member's value asking Anthropic to compare this request's
    cache use with the request that answered ``previous_message_id``."""
    return b'{"previous_message_id":' + orjson.dumps(previous_message_id) + b"}"


def with_beta(values: Sequence[str]) -> str:
    """The ``anthropic-beta`` header with the diagnosis beta added to the client's
    (comma-separated; every value it sent kept, in order; not added twice)."""
    names = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return ",".join(names if DIAGNOSIS_BETA in names else [*names, DIAGNOSIS_BETA])


def sent_breakpoints(raw: bytes, member: str = CACHE_CONTROL) -> bool:
    """True when the client's own bytes carry a ``member`` (``cache_control``, or
    OpenAI's ``prompt_cache_breakpoint``) anywhere: its own breakpoints, leave the
    request alone.  Checked on what the client sent, not on the repaired body: a
    fork's recorded system and tools carry the breakpoints prefixpin added to its
    parent."""
    if member.encode() not in raw:
        return False
    try:
        return has_member(orjson.loads(raw), member)
    except orjson.JSONDecodeError:
        return True


def has_member(node: Any, member: str) -> bool:
    """True when any object under ``node`` has a ``member`` member."""
    if isinstance(node, dict):
        return member in node or any(has_member(v, member) for v in node.values())
    if isinstance(node, list):
        return any(has_member(v, member) for v in node)
    return False


def has_cache_control(node: Any) -> bool:
    """True when any object under ``node`` has a ``cache_control`` member."""
    return has_member(node, CACHE_CONTROL)


def breakpoints(doc: JsonDoc, body: dict[str, Any], *, ttl: str = "5m") -> list[Op]:
    """Edits adding ``cache_control`` breakpoints to an Anthropic Messages request.

    ``body`` is the parse of ``doc`` as it will be forwarded (rules and repairs
    applied); combine the result with the edits already decided with :func:`place`.
    The caller leaves a request with breakpoints of its own alone (:func:`sent_breakpoints`).

    1. The end of system+tools, with ``ttl``: Anthropic's prefix is tools, then
       system, then messages, so that is the last system block (a string
       ``system`` becomes one text block carrying it), or the last tool when
       there is no system to mark.
    2. The newest message before the last user turn: its last cacheable block
       (a string content becomes one text block), at the default 5 minutes.
    """
    out: list[Op] = []
    tools = body.get("tools")
    system = body.get("system")
    first: Op | None = None
    mark = marker(ttl)
    if isinstance(system, str) and system:
        first = SetValue(("system",), _text_block(doc, ("system",), system, mark))
    elif isinstance(system, list):
        first = _on_last_block(doc, ("system",), system, mark)
    if first is None and isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        first = SetMember(("tools", len(tools) - 1), "cache_control", mark)
    if first is not None:
        out.append(first)
    messages = body.get("messages")
    if isinstance(messages, list):
        last_user = max(
            (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=-1
        )
        if last_user > 0:
            op = _on_message(doc, last_user - 1, messages[last_user - 1])
            if op is not None:
                out.append(op)
    return out[:MAX_BREAKPOINTS]


def chat_breakpoints(body: dict[str, Any], *, ttl: str = "5m") -> list[Op]:
    """The same two breakpoints on a chat-completions request LiteLLM translates to
    Anthropic, as ``cache_control`` members LiteLLM carries over (``ttl`` included:
    on a system message or its text part, the last tool, a message with string
    content, a tool call, a content part): members added, no value converted.
    The end of system+tools is the last system message (its last text part when
    its content is a list), else the last tool.  The last user turn is the final
    run of ``user`` / ``tool`` messages (tool results are user turns in Anthropic's shape)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    out: list[Op] = []
    mark = marker(ttl)
    first: Op | None = None
    system = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    if system:
        content = messages[system[-1]].get("content")
        if isinstance(content, str) and content:
            first = SetMember(("messages", system[-1]), "cache_control", mark)
        elif isinstance(content, list):
            first = _on_text_part(("messages", system[-1], "content"), content, mark)
    tools = body.get("tools")
    if first is None and isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        first = SetMember(("tools", len(tools) - 1), "cache_control", mark)
    if first is not None:
        out.append(first)
    turn = len(messages)
    while turn > 0 and isinstance(messages[turn - 1], dict) and messages[turn - 1].get("role") in ("user", "tool"):
        turn -= 1
    if 0 < turn < len(messages) and isinstance(messages[turn - 1], dict):
        op = _on_chat_message(turn - 1, messages[turn - 1])
        if op is not None and (first is None or _target(op) != _target(first)):  # not the system message again
            out.append(op)
    return out


def _on_chat_message(index: int, msg: dict[str, Any]) -> Op | None:
    calls, content = msg.get("tool_calls"), msg.get("content")
    if isinstance(calls, list) and calls and isinstance(calls[-1], dict):
        return SetMember(("messages", index, "tool_calls", len(calls) - 1), "cache_control", EPHEMERAL)
    if isinstance(content, str) and content:
        return SetMember(("messages", index), "cache_control", EPHEMERAL)
    if isinstance(content, list):
        return _on_text_part(("messages", index, "content"), content, EPHEMERAL)
    return None


def _on_text_part(path: Path, parts: list[Any], mark: bytes) -> Op | None:
    for j in range(len(parts) - 1, -1, -1):
        part = parts[j]
        if isinstance(part, dict) and part.get("type") == "text" and part.get("text"):
            return SetMember((*path, j), "cache_control", mark)
    return None


def _text_block(doc: JsonDoc, path: Path, text: str, mark: bytes = EPHEMERAL) -> bytes:
    """``[{"type":"text","text":<the string as written>,"cache_control":...}]``."""
    span = doc.span(path)
    raw = doc.raw[span[0] : span[1]] if span is not None else b""
    if not raw or orjson.loads(raw) != text:  # a rule changed it: its new value
        raw = orjson.dumps(text)
    return b'[{"type":"text","text":' + raw + b',"cache_control":' + mark + b"}]"


def _on_last_block(doc: JsonDoc, path: Path, blocks: list[Any], mark: bytes = EPHEMERAL) -> Op | None:
    for j in range(len(blocks) - 1, -1, -1):
        block = blocks[j]
        if not isinstance(block, dict) or block.get("type") in _UNCACHEABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue  # Anthropic rejects cache_control on an empty text block
        return SetMember((*path, j), "cache_control", mark)
    return None


def _on_message(doc: JsonDoc, index: int, msg: Any) -> Op | None:
    if not isinstance(msg, dict):
        return None
    content = msg.get("content")
    path: Path = ("messages", index, "content")
    if isinstance(content, str) and content:
        return SetValue(path, _text_block(doc, path, content))
    if isinstance(content, list):
        return _on_last_block(doc, path, content)
    return None


def _target(op: Op) -> Path:
    if isinstance(op, SetMember):
        return (*op.obj, op.key)
    if isinstance(op, SetValue | SetString):
        return op.path
    raise TypeError(op)


def place(ops: Sequence[Op], added: Sequence[Op], member: str = CACHE_CONTROL) -> list[Op]:
    """``ops`` with the breakpoint edits ``added`` (breakpoints are ``member`` members).

    - An edit inside a value an earlier edit replaces whole (a fork's recorded
      system, the lineage's recorded tools[]) is made inside that edit's bytes
      instead; one inside a deleted value is dropped.
    - Items an earlier edit put in an array (a chat fork's recorded system
      messages) are counted as the forwarded body counts them: an edit inside one
      is made in its bytes, one past them goes to the client's own index.
    - Recorded bytes lose the ``member`` members they were recorded with (the
      parent's breakpoints, perhaps at another place or TTL): the request carries
      exactly the breakpoints ``added``, so never more than 4 nor a 1-hour one
      after a 5-minute one."""
    out = [_unmarked(op, member) for op in ops]
    for op in added:
        path = _target(op)
        for i, prior in enumerate(out):
            if isinstance(prior, SetItems):
                n = len(prior.array)
                index = path[n] if len(path) > n and path[:n] == prior.array else None
                if not isinstance(index, int):
                    continue
                k = index - prior.start
                if 0 <= k < len(prior.items):
                    items = list(prior.items)
                    items[k] = render(JsonDoc(items[k]), [_relative(op, n + 1)])
                    out[i] = SetItems(prior.array, prior.start, prior.stop, tuple(items))
                    break
                if k >= len(prior.items):  # past the recorded run: where the client has it
                    op = _moved(op, n, prior.stop - prior.start - len(prior.items))
                    path = _target(op)
                continue
            whole = _replaced(prior)
            if whole is None or path[: len(whole)] != whole:
                continue
            raw = _raw(prior)
            if raw is not None:
                inner = JsonDoc(raw)
                out[i] = _with_raw(prior, render(inner, [_relative(op, len(whole))]))
            break
        else:
            out.append(op)
    return out


def unmarked(raw: bytes, member: str = CACHE_CONTROL) -> bytes:
    """``raw`` (a JSON value) without its ``member`` members, every other byte as it was."""
    if orjson.dumps(member) not in raw:
        return raw
    paths = list(_marked(orjson.loads(raw), (), member))
    return render(JsonDoc(raw), [DeleteMember(p, member) for p in paths]) if paths else raw


def _marked(node: Any, path: Path, member: str) -> Iterator[Path]:
    """The paths of the objects under ``node`` that carry a ``member``."""
    if isinstance(node, dict):
        if member in node:
            yield path
        for key, value in node.items():
            yield from _marked(value, (*path, key), member)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _marked(value, (*path, i), member)


def _unmarked(op: Op, member: str) -> Op:
    mark = orjson.dumps(member)
    if isinstance(op, SetItems):
        if any(mark in item for item in op.items):
            return SetItems(op.array, op.start, op.stop, tuple(unmarked(item, member) for item in op.items))
        return op
    raw = _raw(op)
    return _with_raw(op, unmarked(raw, member)) if raw is not None and mark in raw else op


def _moved(op: Op, depth: int, delta: int) -> Op:
    """``op`` with the array index at ``depth`` of its path moved by ``delta``."""

    def move(path: Path) -> Path:
        index = path[depth]
        assert isinstance(index, int)
        return (*path[:depth], index + delta, *path[depth + 1 :])

    if isinstance(op, SetMember):
        return SetMember(move(op.obj), op.key, op.raw)
    if isinstance(op, SetValue):
        return SetValue(move(op.path), op.raw)
    raise TypeError(op)


def _replaced(op: Op) -> Path | None:
    """The path whose whole value ``op`` replaces or removes (None: a string edit)."""
    if isinstance(op, SetValue):
        return op.path
    if isinstance(op, SetMember | DeleteMember):
        return (*op.obj, op.key)
    if isinstance(op, AddMember):
        return (op.key,)
    if isinstance(op, SetItems):
        return op.array
    return None


def _raw(op: Op) -> bytes | None:
    return op.raw if isinstance(op, SetValue | SetMember | AddMember) else None


def _with_raw(op: Op, raw: bytes) -> Op:
    if isinstance(op, SetValue):
        return SetValue(op.path, raw)
    if isinstance(op, SetMember):
        return SetMember(op.obj, op.key, raw)
    if isinstance(op, AddMember):
        return AddMember(op.key, raw)
    raise TypeError(op)


def _relative(op: Op, depth: int) -> Op:
    if isinstance(op, SetMember):
        return SetMember(op.obj[depth:], op.key, op.raw)
    if isinstance(op, SetValue):
        return SetValue(op.path[depth:], op.raw)
    raise TypeError(op)


__all__ = [
    "CACHE_CONTROL",
    "DIAGNOSIS_BETA",
    "EPHEMERAL",
    "EPHEMERAL_1H",
    "breakpoints",
    "cache_key",
    "chat_breakpoints",
    "diagnostics",
    "has_cache_control",
    "has_member",
    "marker",
    "place",
    "sent_breakpoints",
    "unmarked",
    "with_beta",
]
