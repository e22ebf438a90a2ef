"""Parse only what changed since a tenant's previous body.

An agent's next request repeats its previous one: the same head
(``{"model":…,"messages":[``), the same tail (``],"tools":[…],…}``) and between
them the same items but for a few: the new turn's, the last user message of a
retry, a system prompt whose counter moved.  :class:`Bodies` keeps a few recent
bodies per tenant with their parse and the byte span of each item of their
item array (chat and Messages ``messages``, Responses ``input``), and parses a
new body as a remembered one's items wherever the bytes are equal, with
``orjson.loads`` only of the gaps between them.

Nothing is assumed about the new bytes.  The head and the tail must be byte for
byte the remembered ones, each reused run of items byte for byte the remembered
items, and each gap must parse on its own as the content of a JSON array
(``[`` + gap + ``]``): the new array is then the concatenation of valid pieces
joined by commas, so its parse *is* the pieces' parses, and the body's parse is
the remembered one with that array in place.  Anything else (a body written
with other spacing or escapes than orjson's, a changed tool list, a gap that is
not whole items) is parsed whole, as before.  A remembered body's item spans are
found, once, by checking that each item's compact serialization is the byte run
at its place; that its array is the member the parse kept (the last of
duplicate keys) is proven by parsing the body with the array replaced by ``0``.

The parse that is kept is never handed out: the pipeline edits its parse in
place (a system text interned or pinned, a date note on a user message).  Each
request gets a new top-level object and array, new copies of every item the
pipeline may write to (system and user messages and items with no role, with
their content parts) and of every other top-level list (Messages ``system``
blocks); assistant and tool messages and ``tools`` are shared.  Rules of scope
``tools`` or ``all`` write into those: with any, bodies are parsed whole.

Per tenant (``scope``), so one tenant's bodies are never compared with, nor can
time, another's.  Bounded in bodies per tenant (``PER_SCOPE``) and in remembered
bytes (``MAX_BYTES``).  What is kept of a body (:class:`Kept`) goes with its
request to :func:`canonicalize.analysis.prepare`, which takes from it the links
of the history the body shares with the one it was parsed from.  The memo
changes under its lock (the proxy parses by pieces on its event loop only; a big
body is parsed whole on a worker thread, without the memo).
``Bodies(enabled=False)`` remembers nothing: every body is parsed whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice, takewhile
from operator import is_
from typing import Any

import orjson

from canonicalize.jsonspan import JsonDoc

PER_SCOPE = 8  # remembered bodies per tenant: one per live session of an agent
NEAR = 512  # how far a session's second item is looked for from where it was
MAX_BYTES = 8 * 2**20  # raw bytes remembered in all (their parses are mostly shared)
# The roles of the items no request writes to (it writes system texts and date notes
# on user messages): the only items shared between requests; every other is copied.
SHARED = frozenset({"assistant", "tool"})

Span = tuple[int, int]


class Kept:
    """One remembered body: its bytes, its parse (kept, never handed out), the layout
    of its item array, found on first use (``layout``), and what the pipeline found
    of it (``hist``)."""

    __slots__ = (
        "base",
        "close",
        "doc",
        "head",
        "hist",
        "items",
        "key",
        "lead_spans",
        "open",
        "raw",
        "spans",
        "tail",
        "top",
        "writable",
    )

    def __init__(self, raw: bytes, top: dict[str, Any], key: str, doc: JsonDoc) -> None:
        self.raw = raw
        self.top = top
        self.key = key
        self.items: list[Any] = top[key]
        self.doc = doc  # the request's: spans it located while served carry over
        self.spans: list[Span] | None = None  # None: not yet known; [] and open < 0: unusable
        self.open = -1  # offset of the array's '['
        self.close = -1  # offset of its ']'
        self.head = b""  # raw[: open + 1]
        self.tail = b""  # raw[close:]
        # The body this one was parsed from (its items reused are the same objects), until
        # the pipeline took what it needs of it; and what the pipeline found of this one:
        # where its history starts in ``items``, the history's links and sizes.
        self.base: Kept | None = None
        self.writable: list[int] = []  # the indices of the items a request gets copies of
        self.hist: tuple[int, tuple[bytes, ...], tuple[int, ...]] | None = None
        self.lead_spans: list[Span] | None = None  # see lead()

    def lead(self) -> list[Span]:
        """The spans of the first two items (fewer when the array is shorter or they are
        not where a search finds them), found once.  Unproven until :meth:`layout`, which
        every reuse calls first: it only picks the bodies worth trying, at the cost of
        serializing two items instead of all of them and parsing the body again."""
        if self.spans is not None:
            return self.spans[:2] if self.open >= 0 else []
        if self.lead_spans is None:
            self.lead_spans = _lead(self.raw, self.key, self.items)
        return self.lead_spans

    def layout(self) -> bool:
        """Find and prove the item spans (once); False when this body cannot be reused."""
        if self.spans is not None:
            return self.open >= 0
        self.spans = []
        raw, items = self.raw, self.items
        member = b'"%s":[' % self.key.encode()
        at = raw.find(member)
        if at < 0:
            return False
        start = at + len(member) - 1
        spans: list[Span] = []
        pos = start + 1
        try:
            for n, item in enumerate(items):
                if n:
                    if raw[pos : pos + 1] != b",":
                        return False
                    pos += 1
                form = orjson.dumps(item)
                if not raw.startswith(form, pos):
                    return False
                spans.append((pos, pos + len(form)))
                pos += len(form)
            if raw[pos : pos + 1] != b"]":
                return False
            # The array found is the member the parse kept (not an earlier duplicate,
            # not a look-alike inside a string): with it replaced by 0, the rest parses
            # to the same members and the key to that 0.
            probe = orjson.loads(raw[:start] + b"0" + raw[pos + 1 :])
        except (orjson.JSONDecodeError, TypeError):
            return False
        if not isinstance(probe, dict) or type(probe.get(self.key)) is not int or probe[self.key] != 0:
            return False
        probe[self.key] = items
        if probe != self.top:
            return False
        self.spans, self.open, self.close = spans, start, pos
        self.head, self.tail = raw[: start + 1], raw[pos:]
        return True


class Bodies:
    """The recent bodies of each tenant (see the module docstring)."""

    def __init__(self, *, per_scope: int = PER_SCOPE, max_bytes: int = MAX_BYTES, enabled: bool = True) -> None:
        self.per_scope = per_scope
        self.max_bytes = max_bytes
        self.enabled = enabled
        self._scopes: OrderedDict[str, list[Kept]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # bodies parsed from a remembered one (tests, benchmarks)

    def parse(
        self, raw: bytes, key: str, scope: str, *, remember: bool = True
    ) -> tuple[Any, JsonDoc, Kept | None] | None:
        """The parse of ``raw`` (a copy the caller may edit), its :class:`JsonDoc` and
        what is kept of it (None: nothing); None when ``raw`` is not JSON.  ``key``
        names the item array.  With ``remember`` False (rules of scope ``tools`` or
        ``all`` edit tools[] and any message in place), the body is parsed whole and
        nothing is kept."""
        if not (remember and self.enabled):
            return _whole(raw)
        with self._lock:
            return self._parse(raw, key, scope)

    def _parse(self, raw: bytes, key: str, scope: str) -> tuple[Any, JsonDoc, Kept | None] | None:
        recent = self._scopes.get(scope)
        body = None
        if recent is not None:
            self._scopes.move_to_end(scope)
            # The bodies whose first item this one starts with first (the same session,
            # as a rule), then the others (a system prompt that changed).
            for n in _candidates(recent, raw):
                old = recent[n]
                found = _reuse(old, raw, key)
                if found is None:
                    continue
                top, doc, layout, writable = found
                body = Kept(raw, top, key, doc)
                body.writable = writable
                if layout is not None:
                    body.open, body.close, body.head, body.tail = old.open, layout[0], old.head, old.tail
                    body.spans = layout[1]
                body.base, old.base = old, None  # a chain of two at most
                self._forget(recent, n)
                self.reused += 1
                break
        if body is None:
            whole = _whole(raw)
            if whole is None:
                return None
            top, doc, _ = whole
            if not isinstance(top, dict) or not isinstance(top.get(key), list):
                return whole
            body = Kept(raw, top, key, doc)
            body.writable = _writable(body.items, 0)
        self._remember(scope, body)
        return _handout(top, key, body.writable), doc, body

    def _remember(self, scope: str, body: Kept) -> None:
        recent = self._scopes.get(scope)
        if recent is None:
            recent = self._scopes[scope] = []
        recent.insert(0, body)
        self._bytes += len(body.raw)
        if len(recent) > self.per_scope:
            self._forget(recent, len(recent) - 1)
        while self._bytes > self.max_bytes and self._scopes:
            oldest = next(iter(self._scopes.values()))
            if oldest:
                self._forget(oldest, len(oldest) - 1)
            if not oldest:
                self._scopes.popitem(last=False)

    def _forget(self, recent: list[Kept], n: int) -> None:
        self._bytes -= len(recent.pop(n).raw)


def _whole(raw: bytes) -> tuple[Any, JsonDoc, None] | None:
    """``raw`` parsed whole, nothing kept; None when it is not JSON."""
    try:
        top = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    try:
        doc = JsonDoc(raw)
    except ValueError:
        return None
    return top, doc, None


def shared_prefix(body: Kept, start: int, base: Kept, base_start: int, most: int) -> int:
    """How many items from ``start`` on are ``base``'s from ``base_start`` on, the same
    objects (reused from it), ``most`` at most."""
    new, old = body.items, base.items
    most = min(most, len(new) - start, len(old) - base_start)
    pairs = map(is_, islice(new, start, start + most), islice(old, base_start, base_start + most))
    return len(list(takewhile(bool, pairs)))


def _reuse(
    old: Kept, raw: bytes, key: str
) -> tuple[dict[str, Any], JsonDoc, tuple[int, list[Span]] | None, list[int]] | None:
    """``raw``'s parse, doc and layout (its close and item spans, when all are known)
    as ``old``'s items where the bytes are equal, or None."""
    if old.key != key or not old.layout():
        return None
    head, tail = old.head, old.tail
    if len(raw) < len(head) + len(tail) or not raw.startswith(head) or not raw.endswith(tail):
        return None
    close = len(raw) - len(tail)  # the new ']'
    runs = _runs(old, raw, close)
    if runs is None:
        return None
    return _assemble(old, raw, runs, close)


Run = tuple[int, int, int]  # a run of old items reused: its first item, its start in the new body, its count


def _runs(old: Kept, raw: bytes, close: int) -> list[Run] | None:
    """The runs of ``old``'s items ``raw``'s array has as they were, in order: those
    it starts with, those it ends with, and one more in the middle (after the first
    changed item); None: nothing in common (another session's body)."""
    spans = old.spans
    assert spans is not None
    n = len(spans)
    src = memoryview(old.raw)
    lo = len(old.head)  # where the items start, in both

    def starts(k: int) -> bool:  # the first k old items start the new array, at the same offsets
        return k == 0 or raw.startswith(src[lo : spans[k - 1][1]], lo)

    if not n or not starts(1):
        k = 0
    elif raw.startswith(src[spans[-1][0] : spans[-1][1]], spans[-1][0]) and starts(n):
        k = n  # (the last item checked alone first: where a retry differs, one compare of it)
    else:
        k = _largest(n - 1, starts)
    at = spans[k - 1][1] if k else lo  # the end of that run, in both

    def ends(m: int) -> bool:  # the last m old items end it (after the first run and a comma)
        if m == 0:
            return True
        s = spans[n - m][0]
        return close - (old.close - s) >= at + (1 if k else 0) and raw.endswith(src[s : old.close], 0, close)

    m = _largest(n - k, ends) if k < n and ends(1) else 0
    tail_at = close - (old.close - spans[n - m][0]) if m else close
    runs: list[Run] = []
    if k:
        runs.append((0, lo, k))
    # One more run in the middle: the old items after the first changed one, found
    # by where the first of them starts, checked whole at that place.
    for first, last in ((k + 1, n - m), (k + 1, n - m - 1)):
        if last - first < 1:
            continue
        lead = src[spans[first][0] : spans[first][1]]
        q = raw.find(lead, at, tail_at)
        while q > at and raw[q - 1] != 0x2C:
            q = raw.find(lead, q + 1, tail_at)
        if q <= at:
            continue
        width = spans[last - 1][1] - spans[first][0]
        if q + width < tail_at and raw.startswith(src[spans[first][0] : spans[last - 1][1]], q):
            runs.append((first, q, last - first))
            break
    if m:
        runs.append((n - m, tail_at, m))
    if not runs and n:
        return None
    return runs


def _assemble(
    old: Kept, raw: bytes, runs: list[Run], close: int
) -> tuple[dict[str, Any], JsonDoc, tuple[int, list[Span]] | None, list[int]] | None:
    """``raw``'s parse, doc and layout: ``old``'s items of ``runs``, the gaps between
    them (whole new items) parsed on their own; None when a gap is not items."""
    spans = old.spans
    assert spans is not None
    items: list[Any] = []
    new_spans: list[Span] = []
    moves: list[tuple[int, int, int, int, int]] = []  # old start, old end, shift, old first, new first
    pos, after_item = len(old.head), False
    old_items, old_writable = old.items, old.writable
    writable: list[int] = []
    try:
        for first, start, count in runs:
            n_before = len(items)
            if not _gap(raw, pos, start, after_item, True, items, new_spans):
                return None
            writable += _writable(items, n_before)
            s0, e0 = spans[first][0], spans[first + count - 1][1]
            base = len(items) - first
            writable += [j + base for j in old_writable if first <= j < first + count]
            shift = start - s0
            moves.append((s0, e0, shift, first, len(items)))
            items += old_items[first : first + count]
            if shift:
                new_spans += [(s + shift, e + shift) for s, e in spans[first : first + count]]
            else:  # the same offsets: the same tuples
                new_spans += spans[first : first + count]
            pos, after_item = e0 + shift, True
        n_before = len(items)
        if not _gap(raw, pos, close, after_item, False, items, new_spans):
            return None
        writable += _writable(items, n_before)
    except (orjson.JSONDecodeError, TypeError):
        return None
    top = dict(old.top)
    top[old.key] = items
    doc = JsonDoc(raw)
    _carry(old, doc, moves, close)
    known = (-1, -1) not in new_spans
    if known:
        doc.known_items = (old.key, new_spans)
    return top, doc, ((close, new_spans) if known else None), writable


def _lead(raw: bytes, key: str, items: list[Any]) -> list[Span]:
    at = raw.find(b'"%s":[' % key.encode())
    if at < 0:
        return []
    pos = at + len(key) + 4  # after the '['
    spans: list[Span] = []
    try:
        for n, item in enumerate(items[:2]):
            if n:
                if raw[pos : pos + 1] != b",":
                    break
                pos += 1
            form = orjson.dumps(item)
            if not raw.startswith(form, pos):
                break
            spans.append((pos, pos + len(form)))
            pos += len(form)
    except TypeError:
        return []
    return spans


def _candidates(recent: list[Kept], raw: bytes) -> Iterator[int]:
    """The remembered bodies worth trying for ``raw``, best first, found as they are
    tried: those it starts with up to the end of their first item (the same session,
    as a rule; that item's last bytes compared first), then those whose second item it
    holds after a comma within ``NEAR`` bytes of where it was (a system prompt that
    changed); newest first; no other (their items could be reused only at the very end)."""
    tried = []
    for n, old in enumerate(recent):
        lead = old.lead()
        if not lead:
            continue
        end = lead[0][1]
        last = max(end - 64, 0)
        src = memoryview(old.raw)
        if raw.startswith(src[last:end], last) and raw.startswith(src[:end]):
            tried.append(n)
            yield n
    for n, old in enumerate(recent):
        lead = old.lead()
        if len(lead) > 1 and n not in tried:
            # Near where it was: a system prompt's counter or date moves it a little.
            item = memoryview(old.raw)[lead[1][0] : lead[1][1]]
            q = raw.find(item, max(lead[1][0] - NEAR, lead[0][0]), lead[1][1] + NEAR)
            if q > 0 and raw[q - 1] == 0x2C:
                yield n


def _largest(n: int, ok: Any) -> int:
    """The largest k in [0, n] with ``ok(k)`` (true for 0, and for every k below one
    it is true for): n and n - 1 tried first (a turn appended, the last message
    changed), then a binary search."""
    if ok(n):
        return n
    if n >= 1 and ok(n - 1):
        return n - 1
    a, b = 0, max(n - 2, 0)
    while a < b:
        mid = (a + b + 1) // 2
        if ok(mid):
            a = mid
        else:
            b = mid - 1
    return a


def _gap(raw: bytes, start: int, end: int, after: bool, before: bool, items: list[Any], spans: list[Span]) -> bool:
    """Parse ``raw[start:end]``, between a reused item (``after``) or the '[', and a
    reused item (``before``) or the ']': new whole items and their separators, or
    just one separator.  Appends the items and their spans (found by their compact
    serialization; unknown spans make the caller's body unusable later)."""
    if after and before:
        if end - start < 1 or raw[start] != 0x2C or raw[end - 1] != 0x2C:
            return False
        if end - start == 1:
            return True
        start, end = start + 1, end - 1
    elif after:
        if start == end:
            return True
        if raw[start] != 0x2C:
            return False
        start += 1
    elif before:
        if start == end:
            return True
        if raw[end - 1] != 0x2C:
            return False
        end -= 1
    elif start == end:
        return True
    if start >= end:
        return False
    new = orjson.loads(b"[" + raw[start:end] + b"]")
    if len(new) == 1:  # one item: the gap is its span
        spans.append((start, end))
        items += new
        return True
    pos = start
    for n, item in enumerate(new):
        if n:
            pos += 1  # ','
        form = orjson.dumps(item)
        if raw.startswith(form, pos):
            spans.append((pos, pos + len(form)))
            pos += len(form)
        else:
            spans.append((-1, -1))
            pos = -(1 << 62)
    items += new
    return True


def _carry(old: Kept, doc: JsonDoc, moves: list[tuple[int, int, int, int, int]], close: int) -> None:
    """The spans the old doc located in the head, the tail or a reused item, at their
    new offsets (and items' new indices): the same bytes in the same structure, so
    what proved them there proves them here."""
    key, shift_tail = old.key, close - old.close
    quick = doc._quick
    for path, (s, e) in old.doc._quick.items():
        if e <= old.open:
            quick[path] = (s, e)
        elif s > old.close:
            quick[path] = (s + shift_tail, e + shift_tail)
        elif len(path) >= 2 and path[0] == key and type(path[1]) is int:
            for s0, e0, d, first, new_first in moves:
                if s0 <= s and e <= e0:
                    quick[(key, path[1] - first + new_first, *path[2:])] = (s + d, e + d)
                    break


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """An item the pipeline may write to, and its content parts."""
    item = dict(item)
    content = item.get("content")
    if type(content) is list:
        item["content"] = [dict(p) if type(p) is dict else p for p in content]
    return item


def _writable(items: list[Any], start: int) -> list[int]:
    """The indices from ``start`` on of the items a request may write to (dicts but
    assistant and tool messages)."""
    return [
        i
        for i in range(start, len(items))
        if type(item := items[i]) is dict and not (type(role := item.get("role")) is str and role in SHARED)
    ]


def _handout(top: dict[str, Any], key: str, writable: list[int]) -> dict[str, Any]:
    """A copy of ``top`` the pipeline may write to (see the module docstring)."""
    body = dict(top)
    items = body[key] = list(top[key])
    for i in writable:
        items[i] = _copy(items[i])
    for name, value in top.items():
        if type(value) is list and name != key and name != "tools":
            body[name] = [dict(p) if type(p) is dict else p for p in value]
    return body


__all__ = ["Bodies", "Kept", "shared_prefix"]
