"""Evidence of a prefix break: which part of the prompt changed, where, and how.

:func:`evidence` compares a request's body with its parent's (both as forwarded,
or both as sent) for the cause :func:`canonicalize.predict.predict` named, and
finds the changed part (``field``):

- ``model``;
- ``system`` (``system[i]`` when the system part has several texts: the first
  that differs);
- ``tools[i]`` and the path into it: ``tools[3].description``,
  ``tools[0].parameters.properties.path``, ``tools[5]`` (a tool added or removed);
  chat completions' ``function`` wrapper is left out of the path;
- ``params.<name>`` (a prompt-shaping member, ``identity.PROMPT_PARAMS``);
- the first history item that differs, indexed in the body's own array, and the
  path into it: ``messages[4].content``, ``messages[2].tool_calls[0].function.arguments``,
  ``input[3].output``.

``offset`` is the first differing byte of that part's text in UTF-8 (a string
as it is, any other value as compact JSON); ``before`` and ``after`` hold at most
:data:`EVIDENCE_CHARS` characters of the parent's and of this request's text,
from :data:`CONTEXT_CHARS` characters before the difference.

The break's evidence is the *first* place the two prompts differ.  :func:`places`
lists every place (at most :data:`MAX_PLACES`), in the order the prompt is read:
each changed run of lines in the model, the system texts, each tool, each param
and each history item the parent had sent (a pinned minute further down the
system prompt than the memory counter is a second place).  A place's ``offset`` is
the first differing byte of the run in this request's text.

The texts are the user's prompt: evidence goes to the user's own ``prefixpin
audit`` output, never to logs or metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import orjson

from canonicalize.linediff import lines
from canonicalize.wire.base import Exchange

EVIDENCE_CHARS = 80
CONTEXT_CHARS = 24
MAX_PLACES = 16  # places listed per request; a prompt rewritten throughout has more
_MISSING = object()

Found = tuple[str, str, str]  # field, the parent's text, this request's text


@dataclass(frozen=True, slots=True)
class Evidence:
    field: str
    offset: int  # the first differing byte of the field's text, in UTF-8
    before: str  # the parent's text around the difference
    after: str  # this request's

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "offset": self.offset, "before": self.before, "after": self.after}


def evidence(
    exchange: Exchange, parent: dict[str, Any], body: dict[str, Any], cause: str, params: Sequence[str] = ()
) -> Evidence:
    """The changed part for ``cause`` (module docstring); ``params``: the prompt-shaping
    members the fingerprint compares."""
    found: Found | None
    if cause == "model_changed":
        found = "model", _text(parent.get("model", "")), _text(body.get("model", ""))
    elif cause == "system_changed":
        found = _system(exchange, parent, body)
    elif cause == "tools_changed":
        found = _tools(exchange, parent, body)
    elif cause == "params_changed":
        found = _params(parent, body, params)
    else:
        found = _history(exchange, parent, body)
    if found is None:  # the fingerprints differ where the texts do not (e.g. a part moved)
        found = _FALLBACK.get(cause, cause), "", ""
    return window(*found)


_FALLBACK = {
    "model_changed": "model",
    "system_changed": "system",
    "tools_changed": "tools",
    "params_changed": "params",
    "history_rewritten": "messages",
}


def window(field: str, before: str, after: str) -> Evidence:
    """Evidence for two texts of ``field``: where they first differ, and around it."""
    k = common_prefix(before, after)
    offset = len(before[:k].encode("utf-8", "surrogatepass"))
    start = max(k - CONTEXT_CHARS, 0)
    return Evidence(field, offset, before[start : start + EVIDENCE_CHARS], after[start : start + EVIDENCE_CHARS])


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (slices compared by halves: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _system(exchange: Exchange, parent: dict[str, Any], body: dict[str, Any]) -> Found | None:
    a = [s.get() for s in exchange.system_slots(parent)]
    b = [s.get() for s in exchange.system_slots(body)]
    if len(a) <= 1 and len(b) <= 1:
        x, y = (a or [""])[0], (b or [""])[0]
        return ("system", x, y) if x != y else None
    for i, (x, y) in enumerate(zip_longest(a, b, fillvalue="")):
        if x != y:
            return f"system[{i}]", x, y
    return None


def _tools(exchange: Exchange, parent: dict[str, Any], body: dict[str, Any]) -> Found | None:
    a, b = exchange.tools(parent) or [], exchange.tools(body) or []
    return _first([_unwrap(t) for t in a], [_unwrap(t) for t in b], "tools") or _first(a, b, "tools")


def _unwrap(tool: Any) -> Any:
    """A chat tool's ``function`` object (its ``type`` is always ``function``)."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and set(tool) <= {"type", "function"}:
        return tool["function"]
    return tool


def _params(parent: dict[str, Any], body: dict[str, Any], params: Sequence[str]) -> Found | None:
    for name in dict.fromkeys(params):
        a, b = parent.get(name, _MISSING), body.get(name, _MISSING)
        if not _same(a, b):
            return f"params.{name}", _text(a), _text(b)
    return None


def _history(exchange: Exchange, parent: dict[str, Any], body: dict[str, Any]) -> Found | None:
    a, b = exchange.history(parent), exchange.history(body)
    key = exchange.items_key
    items = body.get(key)
    at = {id(item): j for j, item in enumerate(items)} if isinstance(items, list) else {}
    for i, x in enumerate(a):
        if i >= len(b):  # the request dropped the parent's later messages
            j = len(items) if isinstance(items, list) else i
            return f"{key}[{j}]", _text(x), ""
        y = b[i]
        if exchange.canonical_message(x) != exchange.canonical_message(y):
            path = f"{key}[{at.get(id(y), i)}]"
            return _first(x, y, path) or (path, _text(x), _text(y))
    return None


def _first(a: Any, b: Any, path: str) -> Found | None:
    """The first place, in serialization order, where ``a`` and ``b`` differ: the
    path to it and both values' texts there; None when they are the same."""
    if _same(a, b):
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        # Member by member in order: the first one whose key or value differs.
        for x, y in zip_longest(list(a), list(b), fillvalue=_MISSING):
            if x == y:
                if not _same(a[x], b[y]):
                    return _first(a[x], b[y], f"{path}.{x}")
                continue
            if x is not _MISSING and y is not _MISSING and x in b and y in a:
                break  # the same keys in another order: the object is what changed
            k = y if y is not _MISSING and y not in a else x
            return f"{path}.{k}", _text(a.get(k, _MISSING)), _text(b.get(k, _MISSING))
        return path, _text(a), _text(b)
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if not _same(x, y):
                return _first(x, y, f"{path}[{i}]")
        i = min(len(a), len(b))
        return f"{path}[{i}]", _text(a[i] if i < len(a) else _MISSING), _text(b[i] if i < len(b) else _MISSING)
    return path, _text(a), _text(b)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON text (key order counts: it changes the bytes)."""
    return a is b or (type(a) is type(b) and _dumps(a) == _dumps(b))


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # e.g. an integer beyond 64 bits
        return repr(value).encode("utf-8", "surrogatepass")


def _text(value: Any) -> str:
    if value is _MISSING:
        return ""
    if isinstance(value, str):
        return value
    return _dumps(value).decode("utf-8", "replace")


# -- every place --------------------------------------------------------------------------


def places(
    exchange: Exchange,
    parent: dict[str, Any],
    body: dict[str, Any],
    params: Sequence[str] = (),
    limit: int = MAX_PLACES,
) -> list[Evidence]:
    """Every place ``body``'s prompt differs from ``parent``'s, its new content aside
    (module docstring); at most ``limit``."""
    out: list[Evidence] = []
    _values(parent.get("model", _MISSING), body.get("model", _MISSING), "model", out)
    a = [s.get() for s in exchange.system_slots(parent)]
    b = [s.get() for s in exchange.system_slots(body)]
    if len(a) <= 1 and len(b) <= 1:
        _texts("system", (a or [""])[0], (b or [""])[0], out)
    else:
        for i, (x, y) in enumerate(zip_longest(a, b, fillvalue="")):
            _texts(f"system[{i}]", x, y, out)
    ta, tb = exchange.tools(parent) or [], exchange.tools(body) or []
    _values([_unwrap(t) for t in ta], [_unwrap(t) for t in tb], "tools", out)
    for name in dict.fromkeys(params):
        _values(parent.get(name, _MISSING), body.get(name, _MISSING), f"params.{name}", out)
    _history_places(exchange, parent, body, out)
    return out[:limit]


def _history_places(exchange: Exchange, parent: dict[str, Any], body: dict[str, Any], out: list[Evidence]) -> None:
    """Each item the parent had sent that the request changed or dropped."""
    a, b = exchange.history(parent), exchange.history(body)
    key = exchange.items_key
    items = body.get(key)
    at = {id(item): j for j, item in enumerate(items)} if isinstance(items, list) else {}
    for i, x in enumerate(a):
        if len(out) >= MAX_PLACES:
            return
        if i >= len(b):  # the request dropped the parent's later messages
            j = len(items) if isinstance(items, list) else i
            out.append(window(f"{key}[{j}]", _text(x), ""))
            return
        if exchange.canonical_message(x) != exchange.canonical_message(b[i]):
            _values(x, b[i], f"{key}[{at.get(id(b[i]), i)}]", out)


def _values(a: Any, b: Any, path: str, out: list[Evidence]) -> None:
    """The places ``a`` and ``b`` differ, leaf by leaf (:func:`_first`'s paths)."""
    if len(out) >= MAX_PLACES or _same(a, b):
        return
    if isinstance(a, str) and isinstance(b, str):
        _texts(path, a, b, out)
    elif isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b):
        for k in a:
            _values(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _values(x, y, f"{path}[{i}]", out)
        for i in range(min(len(a), len(b)), max(len(a), len(b))):  # added or removed
            _values(a[i] if i < len(a) else _MISSING, b[i] if i < len(b) else _MISSING, f"{path}[{i}]", out)
    elif isinstance(a, dict) and isinstance(b, dict):  # keys added, removed or moved
        found = _first(a, b, path)
        out.append(window(*found) if found else window(path, _text(a), _text(b)))
    else:
        out.append(window(path, _text(a), _text(b)))


def _texts(field: str, old: str, new: str, out: list[Evidence]) -> None:
    """One place per run of changed lines of two texts."""
    for o1, o2, n1, n2, _ in lines(old, new):
        if len(out) >= MAX_PLACES:
            return
        k = common_prefix(old[o1:o2], new[n1:n2])
        o, n = o1 + k, n1 + k
        ostart, nstart = max(o - CONTEXT_CHARS, 0), max(n - CONTEXT_CHARS, 0)
        offset = len(new[:n].encode("utf-8", "surrogatepass"))
        before = old[ostart : ostart + EVIDENCE_CHARS]
        out.append(Evidence(field, offset, before, new[nstart : nstart + EVIDENCE_CHARS]))
