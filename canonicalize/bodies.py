"""Parse only what changed since a conversation's previous body.

An agent's next request repeats its previous one: the same head
(``{"model":…,"messages":[``), the same tail (``],"tools":[…],…}``) and between
them the same items but for a few: the new turn's, the last user message of a
retry, a system prompt whose counter moved.  :class:`Bodies` keeps the newest
body of each conversation in flight with its parse and the byte span of each
item of its item array (chat and Messages ``messages``, Responses ``input``), and
parses a new body as a remembered one's items wherever the bytes are equal, with
``orjson.loads`` only of the gaps between them; a gap of one item where one old item
stood that differs from it only inside its last member, a long string (a system
prompt whose minute moved), is that item with only the string parsed
(:mod:`canonicalize.strpiece`).

A body finds its conversation's previous body by its *lead*: the bytes of the
first two items of its item array (a system prompt and the first user message,
or the first turn), found by a skim of the raw bytes and hashed (the first item,
a long prompt as a rule, by its first KiB and its length).  Each kept body
is indexed by both, so a body whose system prompt moved finds its conversation by
the first message, and a new conversation that shares another's system prompt
finds that body (its prompt and tools parse are reused, the other conversation's
body stays).  When neither matches, the tenant's newest body is tried.  An item
the skim cannot cross in ``SKIM_TOKENS`` strings and brackets (a system message of
thousands of text parts) gives no mark: skimmed whole it would cost the loop tens
of ms before the parse, where an agent's items take a few finds.  A body
replaces the one it continues: the same object at item 1 (or at item 0 of a body
of one item), parsed from it.

Nothing is assumed about the new bytes: the lead only picks the bodies worth
trying.  The head and the tail must be byte for byte the remembered ones, each
reused run of items byte for byte the remembered items, and each gap must parse
on its own as the content of a JSON array (``[`` + gap + ``]``): the new array is
then the concatenation of valid pieces joined by commas, so its parse *is* the
pieces' parses, and the body's parse is the remembered one with that array in
place.  Anything else (a body written with other spacing or escapes than
orjson's, a changed tool list, a gap that is not whole items) is parsed whole, as
before.  A remembered body's item spans are found, once, by checking that each
item's compact serialization is the byte run at its place; that its array is the
member the parse kept (the last of duplicate keys) is proven by parsing the body
with the array replaced by ``0``.

The parse that is kept is never handed out: the pipeline edits its parse in
place (a system text interned or pinned, a date note on a user message).  Each
request gets a new top-level object and array, new copies of every item the
pipeline may write to (system and user messages and items with no role, with
their content parts) and of every other top-level list (Messages ``system``
blocks); assistant and tool messages and ``tools`` are shared.  Rules of scope
``tools`` or ``all`` write into those: with any, bodies are parsed whole.

Per tenant (``scope``): the index is keyed by it, so one tenant's bodies are
never compared with, nor can time, another's.  Bounded in bodies (``MAX_BODIES``),
in bodies per tenant (``PER_SCOPE``), in remembered raw bytes (``MAX_BYTES``; a
parse holds ~3x its body's bytes, mostly shared between a conversation's turns;
up to ~10x for a body of many small items)
and in bodies per lead (``PER_KEY``), the least recently used dropped first.
What is kept of a body (:class:`Kept`) goes with its request to
:func:`canonicalize.analysis.prepare`, which takes from it the links of the
history the body shares with the one it was parsed from.  The memo changes under
its lock (the proxy parses by pieces on its event loop only; a big body is parsed
whole on a worker thread, without the memo).  ``Bodies(enabled=False)`` remembers
nothing: every body is parsed whole.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

import orjson
import xxhash

from canonicalize.jsonspan import JsonDoc
from canonicalize.pieces import SHARED, Kept, opening, reuse, shared_prefix, writable

MAX_BODIES = 512  # remembered bodies in all: the conversations in flight
PER_SCOPE = 256  # and per tenant, so one key's conversations leave room for others'
MAX_BYTES = 16 * 2**20  # raw bytes remembered in all (a parse holds ~3x more, mostly shared between turns)
PER_KEY = 4  # bodies found by one lead item: conversations that start alike, a conversation's forks
TRIES = 4  # remembered bodies tried for one new body, best first
LEAD_BYTES = 1024  # the first item's bytes hashed into its mark (with its length)
SKIM_TOKENS = 512  # strings and brackets a lead item is skimmed through at most (~1 ms); past it, no mark

# The tenant, the item's place (0 or 1) and the xxh3-128 of its bytes: what a body is found by
# (the hash the chain's links use, so one hash's code is warm on the request path, not two).
Mark = tuple[str, int, int]
_TOKEN = re.compile(rb'["\[\]{}]')


class Bodies:
    """The newest body of each conversation in flight, per tenant (see the module docstring)."""

    def __init__(
        self,
        *,
        max_bodies: int = MAX_BODIES,
        per_scope: int = PER_SCOPE,
        max_bytes: int = MAX_BYTES,
        per_key: int = PER_KEY,
        enabled: bool = True,
    ) -> None:
        self.max_bodies = max_bodies
        self.per_scope = per_scope
        self.max_bytes = max_bytes
        self.per_key = per_key
        self.enabled = enabled
        self._all: OrderedDict[Kept, None] = OrderedDict()  # least recently used first
        self._scopes: dict[str, OrderedDict[Kept, None]] = {}  # the same, per tenant
        self._index: dict[Mark, list[Kept]] = {}  # newest first, ``per_key`` at most
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # bodies parsed from a remembered one (tests, benchmarks)

    def __len__(self) -> int:
        return len(self._all)

    @property
    def size(self) -> int:
        """Raw bytes of the bodies remembered."""
        return self._bytes

    def newest(self, scope: str) -> Kept | None:
        """The body of ``scope`` remembered last (tests)."""
        recent = self._scopes.get(scope)
        return next(reversed(recent)) if recent else None

    def parse(
        self, raw: bytes, key: str, scope: str, *, remember: bool = True
    ) -> tuple[Any, JsonDoc, Kept | None] | None:
        """The parse of ``raw`` (a copy the caller may edit), its :class:`JsonDoc` and
        what is kept of it (None: nothing); None when ``raw`` is not JSON.  ``key``
        names the item array.  With ``remember`` False (rules of scope ``tools`` or
        ``all`` edit tools[] and any message in place), the body is parsed whole and
        nothing is kept."""
        if not (remember and self.enabled) or len(raw) > self.max_bytes // 8:
            return _whole(raw)  # (a body too big for its share would push out the others)
        marks = lead(raw, key, scope)
        with self._lock:
            return self._parse(raw, key, scope, marks)

    def _parse(
        self, raw: bytes, key: str, scope: str, marks: tuple[Mark, ...]
    ) -> tuple[Any, JsonDoc, Kept | None] | None:
        body = None
        for old in self._candidates(scope, marks):
            found = reuse(old, raw, key)
            if found is None:
                continue
            top, doc, layout, copies, strings = found
            body = Kept(raw, top, key, doc)
            body.writable, body.strings = copies, strings
            if layout is not None:
                body.open, body.close, body.head, body.tail = old.open, layout[0], old.head, old.tail
                body.spans = layout[1]
            body.base, old.base = old, None  # a chain of two at most
            self.reused += 1
            if _continues(body, old):  # it takes the old one's place
                body.continues = True
                self._replace(old, body, marks)
                return _handout(top, key, body.writable), doc, body
            self._touch(old)  # another conversation's body, which its own next turn will want
            break
        if body is None:
            whole = _whole(raw)
            if whole is None:
                return None
            top, doc, _ = whole
            if not isinstance(top, dict) or not isinstance(top.get(key), list):
                return whole
            body = Kept(raw, top, key, doc)
            body.writable = writable(body.items, 0)
        self._remember(scope, marks, body)
        return _handout(top, key, body.writable), doc, body

    def _candidates(self, scope: str, marks: tuple[Mark, ...]) -> list[Kept]:
        """The bodies worth trying, best first: those sharing the new body's item 1 (its
        conversation's, where item 0 is a system prompt that may have moved), then item 0;
        newest first; none of them: the tenant's newest body."""
        found: list[Kept] = []
        index = self._index
        for mark in reversed(marks):
            bucket = index.get(mark)
            if bucket is not None:
                found += [old for old in bucket if old not in found] if found else bucket
        if not found:
            newest = self.newest(scope)
            return [newest] if newest is not None else []
        return found[:TRIES]

    def _remember(self, scope: str, marks: tuple[Mark, ...], body: Kept) -> None:
        body.scope, body.marks = scope, list(marks)
        self._all[body] = None
        recent = self._scopes.get(scope)
        if recent is None:
            recent = self._scopes[scope] = OrderedDict()
        recent[body] = None
        self._bytes += len(body.raw)
        for mark in marks:
            self._mark(body, mark)
        while len(recent) > self.per_scope:
            self._forget(next(iter(recent)))
        self._trim()

    def _replace(self, old: Kept, body: Kept, marks: tuple[Mark, ...]) -> None:
        """``body``, found by ``marks``, remembered in the place of ``old``, which it
        continues (what :meth:`_forget` then :meth:`_remember` would do, in fewer
        steps: in the bucket of a mark both have, ``body`` replaces ``old`` and is
        first)."""
        body.scope, body.marks, was = old.scope, list(marks), old.marks
        old.marks = []
        del self._all[old]
        self._all[body] = None
        recent = self._scopes[body.scope]
        del recent[old]
        recent[body] = None
        index = self._index
        for mark in was:
            bucket = index[mark]
            if mark in marks:  # (as a rule, every one) body first in it, where old was
                if bucket[0] is old:
                    bucket[0] = body
                else:
                    bucket.remove(old)
                    bucket.insert(0, body)
                continue
            bucket.remove(old)
            if not bucket:
                del index[mark]
        for mark in marks:
            if mark not in was:
                self._mark(body, mark)
        self._bytes += len(body.raw) - len(old.raw)
        self._trim()

    def _mark(self, body: Kept, mark: Mark) -> None:
        """``body`` found first by ``mark``; the bucket's oldest unmarked past ``per_key``."""
        bucket = self._index.get(mark)
        if bucket is None:
            bucket = self._index[mark] = []
        bucket.insert(0, body)
        if len(bucket) > self.per_key:
            self._unmark(bucket.pop(), mark)

    def _trim(self) -> None:
        """The least recently used bodies forgotten while over the bounds in number and bytes."""
        while self._all and (len(self._all) > self.max_bodies or self._bytes > self.max_bytes):
            self._forget(next(iter(self._all)))

    def _touch(self, body: Kept) -> None:
        self._all.move_to_end(body)
        self._scopes[body.scope].move_to_end(body)

    def _unmark(self, body: Kept, mark: Mark) -> None:
        """``body`` no longer found by ``mark``; forgotten when nothing finds it."""
        body.marks.remove(mark)
        if not body.marks:
            self._forget(body)

    def forget(self, body: Kept) -> None:
        """``body`` kept no more: its conversation's next request is parsed whole (its
        own steps go to a worker thread, where what it keeps must be no other's)."""
        with self._lock:
            self._forget(body)

    def _forget(self, body: Kept) -> None:
        if body not in self._all:
            return  # forgotten already
        del self._all[body]
        recent = self._scopes[body.scope]
        del recent[body]
        if not recent:
            del self._scopes[body.scope]
        for mark in body.marks:
            bucket = self._index[mark]
            bucket.remove(body)
            if not bucket:
                del self._index[mark]
        body.marks = []
        self._bytes -= len(body.raw)


def lead(raw: bytes, key: str, scope: str) -> tuple[Mark, ...]:
    """What finds ``raw``'s conversation: the first two items of its item array ``key``,
    their bytes hashed with their length (the first item's first ``LEAD_BYTES`` only),
    fewer when there are fewer or the skim is unsure.  Found by
    a skim (the first member named ``key``, strings and brackets only), unproven: a
    wrong guess only finds no body, or one that :func:`reuse` then refuses."""
    member = opening(key)
    at = raw.find(member)
    if at < 0:
        return ()
    pos = at + len(member)
    view = memoryview(raw)
    marks: list[Mark] = []
    for place in (0, 1):
        if place:
            if raw[pos : pos + 1] != b",":
                break
            pos += 1
        end = _skim(raw, pos)
        if end < 0:
            break
        # (item 0, a system prompt as a rule, by its start and length: a 10-50 KB prompt
        # hashed whole on every request would cost more than finding its body saves)
        item = view[pos:end] if place or end - pos <= LEAD_BYTES else view[pos : pos + LEAD_BYTES]
        marks.append((scope, place, xxhash.xxh3_128_intdigest(item, end - pos)))
        pos = end
    return tuple(marks)


def _skim(raw: bytes, pos: int) -> int:
    """The end of the object, array or string at ``pos`` as its brackets and quotes say
    (nothing else checked), or -1 (also past ``SKIM_TOKENS`` strings and brackets)."""
    if raw.startswith(b'{"role":"', pos):  # a message written compactly: a few finds
        role = _string_end(raw, pos + 8)
        if role > 0 and raw.startswith(b',"content":"', role):
            content = _string_end(raw, role + 11)
            if content > 0 and raw[content : content + 1] == b"}":
                return content + 1
    if raw[pos : pos + 1] not in (b"{", b"[", b'"'):
        return -1
    depth = 0
    search = _TOKEN.search
    for _ in range(SKIM_TOKENS):
        m = search(raw, pos)
        if m is None:
            return -1
        i = m.start()
        c = raw[i]
        if c == 0x22:  # a string: to the next quote that no odd run of backslashes escapes
            end = _string_end(raw, i)
            if end < 0:
                return -1
            pos = end
        else:
            depth += 1 if c in (0x7B, 0x5B) else -1
            pos = i + 1
        if depth <= 0:
            return pos if depth == 0 else -1
    return -1


def _string_end(raw: bytes, start: int) -> int:
    """One past the quote that closes the string opening at ``start``, or -1."""
    end = raw.find(b'"', start + 1)
    while end > 0:
        i = end
        while raw[i - 1] == 0x5C:  # a quote after an odd run of backslashes is escaped
            i -= 1
        if (end - i) % 2 == 0:
            return end + 1
        end = raw.find(b'"', end + 1)
    return -1


def _continues(body: Kept, old: Kept) -> bool:
    """``body`` goes on from ``old`` (the same conversation): it holds ``old``'s item 1
    (or item 0, when ``old`` has no other) at its place, the same object."""
    new, was = body.items, old.items
    if len(was) == 1:
        return bool(new) and new[0] is was[0]
    return len(was) > 1 and len(new) > 1 and new[1] is was[1]


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


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """An item the pipeline may write to, and its content parts."""
    item = dict(item)
    content = item.get("content")
    if type(content) is list:
        item["content"] = [dict(p) if type(p) is dict else p for p in content]
    return item


def _handout(top: dict[str, Any], key: str, copies: list[int]) -> dict[str, Any]:
    """A copy of ``top`` the pipeline may write to (see the module docstring)."""
    body = dict(top)
    items = body[key] = list(top[key])
    for i in copies:
        items[i] = _copy(items[i])
    for name, value in top.items():
        if type(value) is list and name != key and name != "tools":
            body[name] = [dict(p) if type(p) is dict else p for p in value]
    return body


__all__ = ["LEAD_BYTES", "SHARED", "SKIM_TOKENS", "Bodies", "Kept", "lead", "shared_prefix"]
