"""Byte spans of JSON values by path, and edits spliced into the raw bytes.

The proxy must forward every byte it did not mean to change exactly as the client
sent it (``0.50``, ``1e5``, key order, duplicate keys, ``\\u00e9``, whitespace), so
it never re-serializes a body: :class:`JsonDoc` locates the ``[start, end)`` byte
span of a value by path and :class:`Edits` splices replacements into the raw bytes.

``raw`` must be valid JSON (the proxy has already parsed it with orjson); on
malformed input the scanner raises :class:`ValueError` rather than guess.

Locating is lazy and cached per document: a container is scanned member by
member only as far as a path needs, and a value that must be stepped over is
consumed by one precompiled regex (balanced brackets up to ``_NEST`` levels,
whole strings included), so the Python loop runs per member on the path, never
per string.  Object keys follow orjson / ``json.loads``: the *last* occurrence
of a duplicate key wins.  A nested object is simply scanned to its end; for the
top-level object that would mean stepping over the whole body, so
:meth:`JsonDoc._absent_after` first asks a cheap, conservative question of the raw
bytes — does any spelling of ``"key"`` occur after this point at all? — and the
scan goes on only when it might.

Errors (``KeyError`` so callers fail open)::

    KeyError
     └── PathError        no value at that path (absent key, index out of range, not a container)
    ValueError
     └── EditConflict     two edits overlap in a way apply() cannot order
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

import orjson

__all__ = ["EditConflict", "Edits", "JsonDoc", "Member", "Path", "PathError", "has_line_break", "moved"]

Path = tuple[str | int, ...]
"""Keys and indexes from the top-level value: ``("messages", 0, "content")``; ``()`` is the whole value."""

# [^"\\] spelled as ranges: sre compiles a 2-literal negated set to a slow per-byte
# op sequence, but three ranges to a bitmap (~4x faster on long string bodies).
_NQ = rb"[\x00-!#-\[\]-\xff]"
_STR = rb'"' + _NQ + rb"*+(?:\\." + _NQ + rb'*+)*+"'
_RUN = rb'[^"\[\]{}]++'  # bytes that are neither a string nor a bracket
_NEST = 16  # bracket levels one regex call consumes; deeper values fall back to a Python loop


def _nested(levels: int) -> bytes:
    """A balanced container of at most ``levels`` bracket levels (possessive: never backtracks)."""
    inner = _RUN + rb"|" + _STR + (rb"|" + _nested(levels - 1) if levels > 1 else b"")
    return rb"[\[{](?:" + inner + rb")*+[\]}]"


_WS = re.compile(rb"[ \t\n\r]*+")
_STRING = re.compile(_STR, re.S)
_SCALAR = re.compile(rb"[^ \t\n\r,\]}]++")
_CONTAINER = re.compile(_nested(_NEST), re.S)
_FILL = re.compile(rb"(?:" + _RUN + rb"|" + _STR + rb"|" + _nested(_NEST - 1) + rb")*+", re.S)
_FIRST_KEY = re.compile(rb"[ \t\n\r]*+(" + _STR + rb")[ \t\n\r]*+:[ \t\n\r]*+", re.S)
_NEXT_KEY = re.compile(rb"[ \t\n\r]*+,[ \t\n\r]*+(" + _STR + rb")[ \t\n\r]*+:[ \t\n\r]*+", re.S)
_NEXT_ITEM = re.compile(rb"[ \t\n\r]*+,[ \t\n\r]*+")
_OBJECT_END = re.compile(rb"[ \t\n\r]*+}")
_ASCII_ESCAPE = re.compile(rb"\\u00([0-7][0-9a-fA-F])")
_WS_BYTES = (b" ", b"\t", b"\n", b"\r")
_NEAR = 2048  # bytes searched forward first for a key that is probably close ahead
_TAIL_TRIES = 4  # spellings of a key tried from the end of a body (JsonDoc._tail_span)
_COLON = re.compile(rb"[ \t\n\r]*+:")
_OPEN = (0x7B, 0x5B)  # { [
_CLOSE = {0x7B: 0x7D, 0x5B: 0x5D}
_COMMA, _QUOTE = 0x2C, 0x22


class PathError(KeyError):
    """No value at this path: a key or index is absent, or the path runs through a scalar."""


class EditConflict(ValueError):
    """Two edits overlap and apply() cannot order them (partial overlap, or an edit inside an earlier one)."""


class Member(NamedTuple):
    """One ``"key": value`` of an object, as written: ``key`` decoded, byte offsets into the raw body."""

    key: str
    key_start: int
    value_start: int
    value_end: int


def _skip(pattern: re.Pattern[bytes], raw: bytes, pos: int) -> int:
    """End of ``pattern`` (one that also matches the empty string) at ``pos``."""
    m = pattern.match(raw, pos)
    return pos if m is None else m.end()


@functools.lru_cache(maxsize=256)
def _plain(key: str) -> bytes | None:
    """``key`` as UTF-8 when JSON writes it without escapes (so raw key bytes without a backslash
    equal it exactly when they decode to it); None for a key with a quote, backslash or control character."""
    name = key.encode()
    return name if orjson.dumps(key) == b'"%s"' % name else None


def _escaped(raw: bytes, pos: int) -> bool:
    """Whether the byte at ``pos`` follows an odd run of backslashes."""
    i = pos
    while i > 0 and raw[i - 1] == 0x5C:
        i -= 1
    return (pos - i) % 2 == 1


def has_line_break(raw: bytes, start: int, end: int) -> bool:
    """Whether ``raw[start:end]`` holds a CR or LF."""
    return raw.find(b"\n", start, end) >= 0 or raw.find(b"\r", start, end) >= 0


def _malformed(pos: int) -> ValueError:
    return ValueError(f"malformed JSON at byte {pos}")


class _Node:
    """What is known so far about one container: members/items scanned in source order."""

    __slots__ = ("done", "end", "is_obj", "keys", "ks", "last", "pos", "start", "sure", "ve", "vs")

    def __init__(self, start: int, is_obj: bool, end: int) -> None:
        self.start = start
        self.is_obj = is_obj
        self.end = end  # one past the closing bracket; -1 until known
        self.pos = start + 1  # where scanning resumes; -1 while the last value's end is unknown
        self.done = False  # every member/item scanned
        self.keys: list[str] = []
        self.ks: list[int] = []  # key starts (objects)
        self.vs: list[int] = []  # value starts
        self.ve: list[int] = []  # value ends; -1 until needed
        self.last: dict[str, int] = {}  # key -> index of its last occurrence scanned so far
        self.sure: set[str] = set()  # keys whose last occurrence is proven


class JsonDoc:
    """Raw JSON bytes with lazily located byte spans (located containers are cached)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        start = _skip(_WS, raw, 0) if raw[:1] in _WS_BYTES else 0
        end = len(raw.rstrip(b" \t\n\r")) if raw[-1:] in _WS_BYTES else len(raw)
        if end <= start:
            raise _malformed(0)
        self._root = (start, end)
        self._nodes: dict[int, _Node] = {}
        self._escapes: list[tuple[int, str]] | None = None
        self._escape_scan: tuple[int, int] | None = None  # (from, last "\u00" at or after it, or -1)
        self._quick: dict[Path, tuple[int, int]] = {}  # spans found by _quick_span
        # The items' starts of each array _quick_span stepped into (by the array's start), as
        # far as it went: the next lookup in it goes on from there, so looking up each item
        # of an array in turn (a record's system part, a list of edits) is one pass, not n.
        self._walked: dict[int, list[int]] = {}
        self._absent: dict[str, int] = {}  # key -> a position after which no "key" occurs (proven)
        # The span of each item of the top-level array named here, known from elsewhere
        # (canonicalize.bodies): a path into an item is looked up in that item's bytes alone.
        self.known_items: tuple[str, list[tuple[int, int]]] | None = None
        # Whether the bytes hold no raw line break (CR or LF: in JSON text, whitespace
        # between tokens), when known without looking (canonicalize.bodies: a body parsed
        # by pieces of one without any, and none in its new bytes); None: not known.
        self.flat: bool | None = None

    def is_flat(self) -> bool:
        """Whether the bytes hold no raw line break (:attr:`flat`, looked for once)."""
        if self.flat is None:
            self.flat = not has_line_break(self.raw, 0, len(self.raw))
        return self.flat

    # -- public lookups -------------------------------------------------------------
    def span(self, path: Path) -> tuple[int, int] | None:
        """``[start, end)`` of the value at ``path``, or None when it does not exist."""
        if path and isinstance(path[0], str):
            quick = self._quick.get(path)
            if quick is None and self.known_items is not None and len(path) > 1 and path[0] == self.known_items[0]:
                quick = self._item_span(path)
            quick = quick or self._quick_span(path)
            if quick is None and len(path) == 1:
                quick = self._tail_span(path[0])
            if quick is not None:
                return quick
        return self._exact_span(path)

    def _item_span(self, path: Path) -> tuple[int, int] | None:
        """The span at ``path`` through a known item span (``known_items``): the item's bytes
        are a whole JSON value, and a path inside it means the same there."""
        assert self.known_items is not None
        spans, i = self.known_items[1], path[1]
        if type(i) is not int or not 0 <= i < len(spans):
            return None
        start, end = spans[i]
        if len(path) > 2:
            inner = JsonDoc(self.raw[start:end]).span(path[2:])
            if inner is None:
                return None
            start, end = start + inner[0], start + inner[1]
        self._quick[path] = (start, end)
        return start, end

    def _exact_span(self, path: Path) -> tuple[int, int] | None:
        found = self._locate(path)
        if found is None:
            return None
        node, j = found
        if node is None:
            return self._root
        return node.vs[j], self._end_of(node, j)

    def members(self, path: Path) -> list[Member] | None:
        """Every member of the object at ``path`` in source order, duplicates included; None if not an object."""
        node = self._container(path)
        if node is None or not node.is_obj:
            return None
        self._finish(node)
        return [Member(k, ks, vs, ve) for k, ks, vs, ve in zip(node.keys, node.ks, node.vs, node.ve, strict=True)]

    def items(self, path: Path) -> list[tuple[int, int]] | None:
        """The ``[start, end)`` span of each element of the array at ``path``; None if not an array."""
        node = self._container(path)
        if node is None or node.is_obj:
            return None
        self._finish(node)
        return list(zip(node.vs, node.ve, strict=True))

    def member_start(self, key: str) -> int | None:
        """Where the value of the top-level member ``key`` starts, when it is proven cheaply
        the one a parser keeps (no spelling of ``"key"`` anywhere after it), without
        finding where it ends; None otherwise (absent, or not proven)."""
        root = self._node(self._root[0])
        if root is None or not root.is_obj:
            return None
        j = self._scan_for(root, key)
        if j is None:
            return None
        start = root.vs[j]
        return start if self._absent_after(key, start + 1) else None

    # -- the quick path -----------------------------------------------------------------
    def _quick_span(self, path: Path) -> tuple[int, int] | None:
        """The span at ``path`` through the *first* top-level member named ``path[0]``, or None.

        The common lookup (``messages[0].content`` on a fresh document) in a few regex
        calls and no :class:`_Node`: the first top-level member with that key, in a
        nested object its last member with a key (the object scanned to its end), the
        n-th item of an array.  Only then is that top-level member proven the last
        with its key, by searching the bytes after the deepest point the walk reached
        (past the system message, not from the start of ``messages``).  None whenever
        a step is not that simple or the proof fails: the caller takes the exact path.
        """
        raw = self.raw
        key = path[0]
        assert isinstance(key, str)
        i = self._root[0]
        name = _plain(key)
        if raw[i] != 0x7B or not key.isascii() or name is None or raw.find(b'"%s"' % name, i, i + _NEAR) < 0:
            return None
        start = end = reach = -1
        m = _FIRST_KEY.match(raw, i + 1)
        while m is not None:
            ks, ke = m.span(1)
            text = raw[ks + 1 : ke - 1]
            if text == name or (b"\\" in text and orjson.loads(raw[ks:ke]) == key):
                start = m.end()
                break
            m = _NEXT_KEY.match(raw, self._value_end(m.end()))
        if start < 0:
            return None
        for step in path[1:]:
            if isinstance(step, str):
                name = _plain(step)
                if raw[start] != 0x7B or name is None:
                    return None
                # Scanned to its end: its last member with this key.
                found, i = -1, start + 1
                m = _FIRST_KEY.match(raw, i)
                while m is not None:
                    ks, ke = m.span(1)
                    text = raw[ks + 1 : ke - 1]
                    i = self._value_end(m.end())
                    if text == name or (b"\\" in text and orjson.loads(raw[ks:ke]) == step):
                        found, end = m.end(), i
                    m = _NEXT_KEY.match(raw, i)
                m = _OBJECT_END.match(raw, i)
                if found < 0 or m is None:
                    return None
                start, reach = found, m.end()
            else:
                if raw[start] != 0x5B or step < 0:
                    return None
                walked = self._walked.get(start)
                if walked is None:
                    i = _skip(_WS, raw, start + 1)
                    if i >= len(raw) or raw[i] == 0x5D:
                        return None
                    walked = self._walked[start] = [i]
                while len(walked) <= step:
                    m = _NEXT_ITEM.match(raw, self._value_end(walked[-1]))
                    if m is None:
                        return None
                    walked.append(m.end())
                start, end = walked[step], -1
        if end < 0:
            end = self._value_end(start)
        if not self._absent_after(key, max(end, reach)):
            return None
        self._quick[path] = (start, end)
        return start, end

    def _tail_span(self, key: str) -> tuple[int, int] | None:
        """The span of the top-level member ``key`` found from the end of the body (the
        common lookup of ``tools`` after a long ``messages``: the exact path steps over
        every member before it), or None: not found that way (the caller scans from the
        start).

        The last ``"key"`` followed by a colon (an unescaped quote there opens a key: a
        closing quote is never followed by a letter) is the member when the rest of the
        body, walked from its value member by member, closes exactly at the body's last
        brace: a member of a nested object would meet that object's brace first.  A
        later member whose key decodes to ``key`` (an escaped spelling) answers None."""
        raw, (start, end) = self.raw, self._root
        name = _plain(key)
        if raw[start] != 0x7B or name is None or not key.isascii():
            return None
        needle = b'"%s"' % name
        before = end
        for _ in range(_TAIL_TRIES):
            q = raw.rfind(needle, start + 1, before)
            if q < 0:
                return None
            before = q
            colon = _COLON.match(raw, q + len(needle))
            if colon is None or _escaped(raw, q):
                continue
            value = _skip(_WS, raw, colon.end())
            found = self._closes_root(key, value)
            if found is not None:
                self._quick[(key,)] = (value, found)
                return value, found
        return None

    def _closes_root(self, key: str, value: int) -> int | None:
        """The end of the value at ``value`` when every member after it is the root's up
        to its closing brace (none of them ``key``); None otherwise."""
        raw = self.raw
        try:
            stop = pos = self._value_end(value)
            while (m := _NEXT_KEY.match(raw, pos)) is not None:
                ks, ke = m.span(1)
                text = raw[ks + 1 : ke - 1]
                if (orjson.loads(raw[ks:ke]) if b"\\" in text else text.decode()) == key:
                    return None
                pos = self._value_end(m.end())
        except ValueError:
            return None
        m = _OBJECT_END.match(raw, pos)
        return stop if m is not None and m.end() == self._root[1] else None

    # -- locating ---------------------------------------------------------------------
    def _locate(self, path: Path) -> tuple[_Node | None, int] | None:
        """The container holding the value at ``path`` and its index there (None, 0 for the root)."""
        if path and isinstance(path[0], str):
            root = self._node(self._root[0])
            if root is not None and root.is_obj and not root.done and path[0] not in root.sure:
                sure, found = self._locate_unproven(root, path)
                if sure:
                    return found
        return self._walk(path)

    def _locate_unproven(self, root: _Node, path: Path) -> tuple[bool, tuple[_Node | None, int] | None]:
        """``path`` under the top-level member scanned so far, its last occurrence proven afterwards.

        Proving first (:meth:`_member`) searches the body from the member's value on;
        proving after the descent searches only from the end of what the descent
        scanned (for ``messages[0].content``: past the system prompt).  Nothing is
        assumed: when the proof fails, or the path is absent under this occurrence,
        the answer is ``(False, None)`` and the caller takes the exact path.
        """
        key = path[0]
        assert isinstance(key, str)
        j = self._scan_for(root, key)
        if j is None:
            return True, None  # proven absent
        found = self._walk(path[1:], root.vs[j], root, j)
        if found is None:
            return False, None
        node, k = found
        assert node is not None
        reach = self._end_of(node, k)
        if node is not root and node.end > reach:  # a nested object is scanned to its end
            reach = node.end
        if not self._absent_after(key, reach):
            return False, None
        root.sure.add(key)
        return True, found

    def _scan_for(self, node: _Node, key: str) -> int | None:
        """The last member with ``key`` scanned so far, stepping on to the next one if none is; None: proven absent."""
        j = node.last.get(key)
        if j is not None:
            return j
        if self._absent_after(key, self._resume(node), near=True):
            return None
        while self._step(node):
            if node.keys[-1] == key:
                return len(node.vs) - 1
        return None

    def _walk(
        self, path: Path, start: int = -1, parent: _Node | None = None, j: int = 0
    ) -> tuple[_Node | None, int] | None:
        """``path`` from the value at ``start`` (the root by default), each top-level key proven last first."""
        if start < 0:
            start = self._root[0]
        for step in path:
            node = self._node(start)
            if node is None:
                return None
            if isinstance(step, str):
                found = self._member(node, step) if node.is_obj else None
            else:
                found = None if node.is_obj else self._item(node, step)
            if found is None:
                return None
            parent, j, start = node, found, node.vs[found]
        return parent, j

    def _container(self, path: Path) -> _Node | None:
        span = self.span(path)
        return None if span is None else self._node(span[0])

    def _node(self, start: int) -> _Node | None:
        node = self._nodes.get(start)
        if node is None:
            c = self.raw[start]
            if c not in _OPEN:
                return None
            end = self._root[1] if start == self._root[0] else -1
            node = self._nodes[start] = _Node(start, c == 0x7B, end)
        return node

    def _member(self, node: _Node, key: str) -> int | None:
        j = node.last.get(key)
        if node.done or key in node.sure:
            return j
        if node.start != self._root[0]:
            # A nested object is small next to the rest of the body: scanning it to its
            # end is cheaper than searching the whole remainder for a duplicate.
            self._finish_members(node)
            return node.last.get(key)
        if j is None and self._absent_after(key, self._resume(node), near=True):
            return None
        if j is not None and self._absent_after(key, node.vs[j]):
            node.sure.add(key)
            return j
        while self._step(node):
            if node.keys[-1] == key and self._absent_after(key, node.vs[-1]):
                node.sure.add(key)
                break
        return node.last.get(key)

    def _item(self, node: _Node, index: int) -> int | None:
        if index < 0:
            self._finish(node)
            index += len(node.vs)
            return index if index >= 0 else None
        while len(node.vs) <= index and self._step(node):
            pass
        return index if index < len(node.vs) else None

    def _resume(self, node: _Node) -> int:
        return node.pos if node.pos >= 0 else node.vs[-1]

    def _finish_members(self, node: _Node) -> None:
        while self._step(node):
            pass

    def _finish(self, node: _Node) -> None:
        self._finish_members(node)
        for j, end in enumerate(node.ve):
            if end < 0:
                node.ve[j] = self._value_end(node.vs[j])

    def _end_of(self, node: _Node, j: int) -> int:
        end = node.ve[j]
        if end < 0:
            end = node.ve[j] = self._value_end(node.vs[j])
            if j == len(node.vs) - 1:
                node.pos = end
        return end

    def _step(self, node: _Node) -> bool:
        """Scan one more member/item of ``node``; False once the closing bracket is reached."""
        if node.done:
            return False
        raw, vs = self.raw, node.vs
        pos = node.pos
        if pos < 0:
            pos = self._end_of(node, len(vs) - 1)
        if node.is_obj:
            # One regex call per member: separator, key and colon.
            m = (_NEXT_KEY if vs else _FIRST_KEY).match(raw, pos)
            if m is None:
                return self._close(node, pos)
            ks, ke = m.span(1)
            text = raw[ks + 1 : ke - 1]
            # Decoding through a JSON parser only when needed: escapes are rare in keys.
            key: str = orjson.loads(raw[ks:ke]) if b"\\" in text else text.decode()
            node.last[key] = len(vs)
            node.keys.append(key)
            node.ks.append(ks)
            i = m.end()
        elif vs:
            m = _NEXT_ITEM.match(raw, pos)
            if m is None:
                return self._close(node, pos)
            i = m.end()
        else:
            i = _skip(_WS, raw, pos)
            if i < len(raw) and raw[i] == 0x5D:
                return self._close(node, i)
        vs.append(i)
        node.ve.append(-1)
        node.pos = -1
        return True

    def _close(self, node: _Node, pos: int) -> bool:
        """At ``node``'s closing bracket (after whitespace): mark it done; anything else is malformed."""
        raw = self.raw
        i = _skip(_WS, raw, pos)
        if i < len(raw) and raw[i] == _CLOSE[raw[node.start]]:
            node.done, node.end = True, i + 1
            return False
        raise _malformed(i)

    def _value_end(self, start: int) -> int:
        raw = self.raw
        c = raw[start] if start < len(raw) else -1
        if c == _QUOTE:
            i = raw.find(b'"', start + 1)
            if i > 0 and raw[i - 1] != 0x5C:  # the common case: the next quote is not escaped
                return i + 1
            return self._string_end(start)
        elif c in _OPEN:
            node = self._nodes.get(start)
            if node is not None and node.end >= 0:
                return node.end
            m = _CONTAINER.match(raw, start)
            if m is None:
                return self._deep_end(start)
        else:
            m = _SCALAR.match(raw, start)
        if m is None or m.end() == start:
            raise _malformed(start)
        return m.end()

    def _string_end(self, start: int) -> int:
        """End of the string at ``start``: memchr to each quote, the regex only after many ``\\"``."""
        raw = self.raw
        i = start
        for _ in range(8):
            i = raw.find(b'"', i + 1)
            if i < 0:
                raise _malformed(start)
            j = i
            while raw[j - 1] == 0x5C:  # a quote after an odd run of backslashes is escaped
                j -= 1
            if (i - j) % 2 == 0:
                return i + 1
        m = _STRING.match(raw, start)
        if m is None:
            raise _malformed(start)
        return m.end()

    def _deep_end(self, start: int) -> int:
        """End of a container nested deeper than ``_NEST``: a Python step per too-deep bracket only."""
        raw, depth, i = self.raw, 0, start
        while i < len(raw):
            c = raw[i]
            if c in _OPEN:
                depth += 1
            elif c in b"]}":
                depth -= 1
                if depth == 0:
                    return i + 1
            else:
                break
            i = _skip(_FILL, raw, i + 1)
        raise _malformed(i)

    def _absent_after(self, key: str, pos: int, *, near: bool = False) -> bool:
        """True when no spelling of ``"key"`` occurs at or after ``pos``, so no later member has this key.

        Conservative: False means "maybe", and the caller scans.  The canonical spelling
        is searched for once; any other spelling of an ASCII key must contain a
        ``\\u00XX`` escape of one of its characters (or ``\\/``), which are looked for
        only when a ``\\u00`` occurs after ``pos`` at all.  Non-ASCII keys always answer
        "maybe".  ``near``: the key is likely close ahead (a lookup, not a proof), so the
        next ``_NEAR`` bytes are searched first.
        """
        if not key.isascii():
            return False
        proven = self._absent.get(key)
        if proven is not None and pos >= proven:
            return True  # (absent after an earlier position: after this one too)
        raw = self.raw
        needle = orjson.dumps(key)
        if near and raw.find(needle, pos, pos + _NEAR) >= 0:
            return False
        if self._occurs(needle, pos) or ("/" in key and raw.rfind(b"\\/", pos) >= 0):
            return False
        if self._escaped_after(key, pos):
            return False
        if proven is None or pos < proven:
            self._absent[key] = pos
        return True

    def _occurs(self, needle: bytes, pos: int) -> bool:
        """Whether ``needle`` (a quoted key) occurs at or after ``pos``.

        bytes.rfind, not find: on a haystack this long find switches to the two-way
        algorithm, several times slower here.  Without its leading quote (a byte that
        is everywhere in JSON) the needle is skipped over faster; each hit is then
        checked for the quote.
        """
        raw = self.raw
        if len(needle) < 6:
            return raw.rfind(needle, pos) >= 0
        probe, end = needle[1:], len(raw)
        while True:
            i = raw.rfind(probe, pos + 1, end)
            if i < 0:
                return False
            if raw[i - 1] == _QUOTE:
                return True
            end = i + len(probe) - 1  # hits starting before i

    def _escaped_after(self, key: str, pos: int) -> bool:
        """Whether a ``\\u00XX`` escape of one of ``key``'s characters may occur at or after ``pos``."""
        raw = self.raw
        scan = self._escape_scan
        if scan is None or pos < scan[0]:
            scan = self._escape_scan = (pos, raw.rfind(b"\\u00", pos))
        if scan[1] < pos:
            return False  # the last "\u00" from scan[0] on lies before pos
        if self._escapes is None:
            first = raw.find(b"\\u00")
            hits = _ASCII_ESCAPE.finditer(raw, first) if first >= 0 else ()
            self._escapes = [(m.start(), chr(int(m.group(1), 16))) for m in hits]
        return any(p >= pos and ch in key for p, ch in self._escapes)


class _Edit(NamedTuple):
    start: int
    end: int
    data: bytes
    seq: int  # order of adding: a later edit supersedes the edits inside its range


def moved(origin: JsonDoc, raw: bytes, strings: Sequence[tuple[int, int]]) -> JsonDoc | None:
    """``raw``'s document when ``raw`` is proven to be ``origin``'s bytes with the string
    values at ``strings`` (spans in ``origin``) replaced by other strings, and members
    perhaps appended to the top-level object: what :func:`canonicalize.edits.render`
    makes of ``SetString`` and ``AddMember`` edits.  A span ``origin`` has located (or
    locates) is moved there instead of being looked for again; None when ``raw`` is
    not that (the caller makes a :class:`JsonDoc` of it).

    The proof is of bytes alone: every byte outside the strings is compared, each new
    string is read to its closing quote at its place, and what follows the top-level
    object's last member is a ``,`` and members that parse.  So ``raw`` has
    ``origin``'s structure, each of its values where ``origin``'s was, shifted by the
    strings' changes in length before it; paths under an appended key are looked
    for in ``raw`` itself (one may repeat a key: the last is the one that counts)."""
    old = origin.raw
    close = origin._root[1] - 1  # the top-level closing brace
    if old[close] != 0x7D:
        return None
    try:
        doc = _Moved(raw, origin)
    except ValueError:
        return None
    view = memoryview(old)
    moves: list[tuple[int, int, int]] = []
    pos = shift = 0
    for start, end in sorted(set(strings)):
        if start < pos or end > close or old[start] != _QUOTE or not raw.startswith(view[pos:start], pos + shift):
            return None
        at = start + shift
        if raw[at : at + 1] != b'"':
            return None
        try:
            shift = doc._string_end(at) - end
        except ValueError:
            return None
        moves.append((start, end, shift))
        pos = end
    if not raw.startswith(view[pos:close], pos + shift):
        return None
    tail = old[close:]
    rest = raw[close + shift :]
    if rest != tail:
        if len(rest) <= len(tail) or rest[0] != 0x2C or not rest.endswith(tail):
            return None
        try:
            members = orjson.loads(b"{" + rest[1 : len(rest) - len(tail)] + b"}")
        except orjson.JSONDecodeError:
            return None
        if not isinstance(members, dict) or not members:
            return None
        doc.appended = frozenset(members)
    doc.moves = moves
    return doc


class _Moved(JsonDoc):
    """A document proven its origin's with some strings replaced (:func:`moved`)."""

    def __init__(self, raw: bytes, origin: JsonDoc) -> None:
        super().__init__(raw)
        self.origin = origin
        self.moves: list[tuple[int, int, int]] = []  # each replaced string's span in origin, and the shift after it
        self.appended: frozenset[str] = frozenset()  # top-level keys appended

    def span(self, path: Path) -> tuple[int, int] | None:
        if not path or path[0] in self.appended:
            return super().span(path)
        found = self.origin.span(path)
        if found is None:
            return None  # not in origin: nor here (the same structure but for the appended members)
        start, end = found
        d_start = d_end = 0
        for s, e, after in self.moves:
            if e <= start:
                d_start = d_end = after
            elif e <= end:
                if s < start:
                    return super().span(path)  # (a span straddling a string: not a value's)
                d_end = after
            elif s < end:
                return super().span(path)
            else:
                break
        return start + d_start, end + d_end


class Edits:
    """Collects edits against one :class:`JsonDoc`, then splices them into the raw bytes once.

    Member deletions and insertions are kept per object and turned into byte ranges
    only in :meth:`apply`, so several of them in one object keep its commas right.
    """

    def __init__(self, doc: JsonDoc) -> None:
        self.doc = doc
        self._edits: list[_Edit] = []
        self._seq = 0
        self._deleted: dict[int, tuple[set[int], int]] = {}  # object start -> (member indexes, seq)
        self._inserted: dict[int, list[tuple[str, bytes, int]]] = {}  # object start -> [(key, value, seq)]

    def __bool__(self) -> bool:
        """Whether any edit was collected."""
        return bool(self._edits or self._deleted or self._inserted)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _object(self, path: Path) -> _Node:
        node = self.doc._container(path)
        if node is None or not node.is_obj:
            raise PathError(path)
        return node

    def replace(self, path: Path, new: bytes) -> None:
        """Replace the value at ``path`` with ``new`` (raw JSON bytes, inserted verbatim)."""
        span = self.doc.span(path)
        if span is None:
            raise PathError(path)
        self._edits.append(_Edit(span[0], span[1], new, self._next()))

    def replace_string(self, path: Path, text: str) -> None:
        """Replace the value at ``path`` with the JSON string ``text``."""
        self.replace(path, orjson.dumps(text))

    def set_member(self, obj: Path, key: str, value: bytes) -> None:
        """Replace the (last) ``key`` of the object at ``obj``, or append ``"key":value`` before its ``}``.

        Appending leaves the object's whitespace as it is and adds a comma when the
        object still has members at that point.
        """
        doc = self.doc
        node = self._object(obj)
        j = doc._member(node, key)
        if j is not None:
            self._edits.append(_Edit(node.vs[j], doc._end_of(node, j), value, self._next()))
            return
        # No scan needed here: a nested object was scanned to its end by the lookup, and
        # the top-level one ends where the body does.
        self._inserted.setdefault(node.start, []).append((key, value, self._next()))

    def delete_member(self, obj: Path, key: str) -> None:
        """Remove ``key`` (every occurrence, if duplicated) and exactly one adjacent comma for each run removed."""
        node = self._object(obj)
        self.doc._finish(node)
        hits = {j for j, k in enumerate(node.keys) if k == key}
        if not hits:
            raise PathError((*obj, key))
        done, _ = self._deleted.get(node.start, (set(), 0))
        self._deleted[node.start] = (done | hits, self._next())

    def replace_items(self, array: Path, start: int, stop: int, new_items: list[bytes]) -> None:
        """Replace elements ``[start, stop)`` of the array at ``array`` with ``new_items`` (raw JSON each).

        ``start == stop`` inserts, ``new_items == []`` deletes; the separators stay
        valid and every other element keeps its bytes.
        """
        doc = self.doc
        node = doc._container(array)
        if node is None or node.is_obj:
            raise PathError(array)
        doc._finish(node)
        vs, ve, n = node.vs, node.ve, len(node.vs)
        if not 0 <= start <= stop <= n:
            raise PathError((*array, start, stop))
        body = b",".join(new_items)
        if start < stop and new_items:
            edit = (vs[start], ve[stop - 1], body)
        elif start < stop:  # delete: take the separator after the run, or before it at the end
            if stop < n:
                edit = (vs[start], vs[stop], b"")
            elif start > 0:
                edit = (ve[start - 1], ve[stop - 1], b"")
            else:
                edit = (vs[0], ve[n - 1], b"")
        elif not new_items:
            return
        elif start < n:
            edit = (vs[start], vs[start], body + b",")
        elif n:
            edit = (ve[n - 1], ve[n - 1], b"," + body)
        else:
            edit = (node.start + 1, node.start + 1, body)
        self._edits.append(_Edit(*edit, self._next()))

    def _member_edits(self) -> list[_Edit]:
        """Byte-range edits for the collected deletions and insertions, object by object."""
        out: list[_Edit] = []
        nodes = self.doc._nodes
        for start, (hits, seq) in self._deleted.items():
            node = nodes[start]
            ks, ve, n = node.ks, node.ve, len(node.vs)
            for a, b in _runs(sorted(hits)):
                if b < n - 1:
                    out.append(_Edit(ks[a], ks[b + 1], b"", seq))
                elif a > 0:
                    out.append(_Edit(ve[a - 1], ve[b], b"", seq))
                else:
                    out.append(_Edit(ks[0], ve[n - 1], b"", seq))
        for start, added in self._inserted.items():
            node = nodes[start]
            if node.done:
                left = len(node.vs) - len(self._deleted.get(start, ((), 0))[0])
            else:  # the top level, not scanned to its end: is anything before the brace?
                left = int(self.doc.raw[_skip(_WS, self.doc.raw, start + 1)] != 0x7D)
            parts = []
            for key, value, _ in added:
                parts.append((b"," if left else b"") + orjson.dumps(key) + b":" + value)
                left += 1
            at = node.end - 1
            out.append(_Edit(at, at, b"".join(parts), added[0][2]))
        return out

    def apply(self) -> bytes:
        """The spliced bytes.

        An edit lying inside another edit's range is dropped when that other edit was
        added later (a structural replacement supersedes finer edits inside it; equal
        ranges: the later wins); inside an earlier edit's range, or overlapping one
        partially, it raises :class:`EditConflict`.  Insertions at one point keep their order.
        """
        kept = _outermost(self._edits + self._member_edits())
        kept.sort(key=lambda e: (e.start, e.end, e.seq))
        raw = memoryview(self.doc.raw)  # slices of a view: the unchanged bytes are copied once, by join
        out: list[bytes | memoryview] = []
        pos = 0
        for e in kept:
            # Sorted by (start, end): any overlap or containment left shows as a start before the last end.
            if e.start < pos:
                raise EditConflict(f"edit of bytes {e.start}-{e.end} overlaps another edit ending at {pos}")
            out.append(raw[pos : e.start])
            out.append(e.data)
            pos = e.end
        out.append(raw[pos:])
        return b"".join(out)


def _outermost(edits: list[_Edit]) -> list[_Edit]:
    """``edits`` but those lying inside a later one's range (:meth:`Edits.apply`).

    An edit inside another starts where that one starts or after, and before it ends
    (:func:`_inside`), so with the edits sorted by start (the longer first) it lies
    in a run of edits each starting before the run's furthest end: each edit is
    compared only with the others of its run, not with every edit (a body with
    thousands of edits, none overlapping, is one pass)."""
    kept: list[_Edit] = []
    run: list[_Edit] = []
    reach = 0
    for e in sorted(edits, key=lambda e: (e.start, -e.end)):
        if run and e.start >= reach:
            kept += [a for a in run if not any(b.seq > a.seq and _inside(a, b) for b in run)]
            run = []
        reach = max(reach, e.end) if run else e.end
        run.append(e)
    kept += [a for a in run if not any(b.seq > a.seq and _inside(a, b) for b in run)]
    return kept


def _inside(e: _Edit, f: _Edit) -> bool:
    """Whether ``e`` lies within ``f``'s replaced range (an insertion at its edges does not)."""
    if e is f or f.start == f.end:
        return False
    if e.start == e.end:
        return f.start < e.start < f.end
    return f.start <= e.start and e.end <= f.end


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive indexes, as inclusive ``(first, last)`` pairs."""
    runs: list[tuple[int, int]] = []
    for j in indexes:
        if runs and runs[-1][1] == j - 1:
            runs[-1] = (runs[-1][0], j)
        else:
            runs.append((j, j))
    return runs
