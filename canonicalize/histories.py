"""Recently hashed histories, so that a turn hashes only its new messages.

A conversation's next request replays the previous request's history and adds a
few messages.  Hashing the whole history again (a canonical form and a digest
per message) is the largest per-request cost that grows with the conversation.
:class:`Histories` remembers recent histories as their compact JSON (one
``orjson.dumps`` of the parsed list), where each message ends in it, and their
links.  A request whose serialized history starts with a remembered one, byte
for byte and up to a message boundary, takes the links of those messages and
hashes only the rest.

Equal bytes of ``orjson.dumps`` mean equal messages (orjson writes every value
one way: ``1`` and ``1.0`` differ, key order is kept), so a reused link is
exactly the link :func:`canonicalize.chain.links` computes: the memo is a pure
function of content, verified byte for byte on every hit, and kept per tenant
(one tenant's requests never find, nor time, another's histories).  It is bounded in histories
(``MAX_ENTRIES``), in bytes (``MAX_BYTES``) and in histories per first message
(``PER_KEY``); a history seen again replaces the entry it extends, and the entry
of the same turn with another last message.  ``Histories(enabled=False)``
remembers nothing: every answer is ``chain.links``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from canonicalize import chain

if TYPE_CHECKING:
    from canonicalize.wire.base import Exchange

MAX_ENTRIES = 4096
MAX_BYTES = 32 * 2**20  # ~300 conversations of 100 KB
PER_KEY = 8  # histories remembered per first message (sessions that start alike)
MIN_MESSAGES = 4  # shorter histories are hashed whole: cheaper than the lookup
_COMMA, _CLOSE = 0x2C, 0x5D  # what follows a message in a serialized list: "," or "]"
_PEEK = 64  # bytes before a boundary compared before the whole prefix
_LINK_COST = 64  # bytes an entry holds per message besides its JSON (link, size, offset)


class _Entry(NamedTuple):
    text: bytes  # the serialized history (as orjson wrote it: nothing copied)
    ends: tuple[int, ...]  # where each message ends in ``text`` (the last one at its closing "]")
    links: tuple[bytes, ...]
    sizes: tuple[int, ...]

    @property
    def cost(self) -> int:
        return len(self.text) + _LINK_COST * len(self.links)


# The wire API (its canonical form), the scope (the proxy's tenant: one tenant's
# requests never find, nor time, another's), the link the chain starts from, the first message.
Key = tuple[str, str, bytes, bytes]


class Histories:
    """A bounded memo of hashed histories (see the module docstring); safe to share
    between threads (a big body is hashed on a worker thread)."""

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        per_key: int = PER_KEY,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.per_key = per_key
        self._buckets: OrderedDict[Key, list[_Entry]] = OrderedDict()
        self._entries = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._entries

    @property
    def size(self) -> int:
        """Bytes held (serialized histories and their keys, plus a per-link estimate)."""
        return self._bytes

    def links(
        self, exchange: Exchange, history: Sequence[Any], prev: bytes = chain.ROOT, *, scope: str = ""
    ) -> tuple[list[bytes], list[int]]:
        """What ``chain.links(exchange, history, prev)`` returns, hashing only the
        messages past the longest prefix remembered in ``scope``."""
        if len(history) < MIN_MESSAGES or not self.enabled:
            return chain.links(exchange, history, prev)
        try:
            text = orjson.dumps(history)
            first = orjson.dumps(history[0])
        except TypeError:  # e.g. an integer beyond 64 bits: hashed as it is, not remembered
            return chain.links(exchange, history, prev)
        key = (exchange.name, scope, prev, first)
        with self._lock:
            bucket = self._buckets.get(key)
            candidates = tuple(bucket) if bucket else ()
            if bucket:
                self._buckets.move_to_end(key)
        base, k = _longest(candidates, text)
        if base is not None and k:
            links, sizes, ends = list(base.links[:k]), list(base.sizes[:k]), list(base.ends[:k])
            start = links[-1]
        else:
            links, sizes, ends, start = [], [], [], prev
        new_links, new_sizes = chain.links(exchange, history[k:], prev=start)
        links += new_links
        sizes += new_sizes
        pos = ends[-1] if ends else 0
        for msg in history[k:]:
            pos += 1 + len(orjson.dumps(msg))  # "[" or "," then the message
            ends.append(pos)
        if pos + 1 == len(text):  # the offsets are those of ``text`` ("]" last): remember it
            entry = _Entry(text, tuple(ends), tuple(links), tuple(sizes))
            # It replaces the history it extends, and the same turn with another last
            # message (a retry): keeping both would have every later turn compare both.
            n = len(base.links) if base is not None else -1
            subsumed = base if k == n or k == n - 1 == len(history) - 1 else None
            self._remember(key, entry, subsumed)
        return links, sizes

    def _remember(self, key: Key, entry: _Entry, subsumed: _Entry | None) -> None:
        cost = entry.cost + _key_cost(key)
        if cost > self.max_bytes // 8:
            return
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = []
            else:
                self._buckets.move_to_end(key)
            # The new history replaces one it extends (and the same history seen again).
            # (Its last link first: only a history with the same one can have the same text.)
            last = entry.links[-1]  # every entry has MIN_MESSAGES links at least
            for old in [e for e in bucket if e is subsumed or (e.links[-1] == last and e.text == entry.text)]:
                bucket.remove(old)
                self._forget(key, old)
            bucket.insert(0, entry)
            self._entries += 1
            self._bytes += cost
            while len(bucket) > self.per_key:
                self._forget(key, bucket.pop())
            while self._buckets and (self._entries > self.max_entries or self._bytes > self.max_bytes):
                old_key, old_bucket = self._buckets.popitem(last=False)
                for old in old_bucket:
                    self._forget(old_key, old)

    def _forget(self, key: Key, entry: _Entry) -> None:
        self._entries -= 1
        self._bytes -= entry.cost + _key_cost(key)


def _longest(candidates: Sequence[_Entry], text: bytes) -> tuple[_Entry | None, int]:
    """The remembered history sharing the most whole messages with ``text``, and how many.
    A history that ``text`` extends (the previous turn's, usually) is found without
    copying anything; only when there is none are the others searched message by message,
    those that could still share more than the best so far (the same turn with another
    last message finds one sharing all but its last and is done)."""
    best: _Entry | None = None
    for entry in candidates:
        if _same(entry.text, entry.ends[-1], text) and (best is None or len(entry.ends) > len(best.ends)):
            best = entry
    if best is not None:
        return best, len(best.ends)
    best_k = 0
    for entry in candidates:
        if len(entry.ends) - 1 <= best_k:  # it cannot share more: all of it is known not to match
            continue
        k = _shared(entry, text)
        if k > best_k:
            best, best_k = entry, k
    return best, best_k


def _shared(entry: _Entry, text: bytes) -> int:
    """How many of ``entry``'s messages begin ``text``, byte for byte (``text`` does not
    extend all of them).  A message counts only when ``text`` has a message boundary
    after it too ("," or "]"): ``1`` is not ``12``.  Galloping from the first message,
    then halving: another session sharing the first message parts early."""
    ends, known = entry.ends, entry.text
    n = len(ends) - 1  # the last message is known not to match
    if n and _same(known, ends[n - 1], text):
        return n  # all but the last: the same turn sent again with another last message (a retry, an edit)
    lo, step = 0, 1
    while lo + step <= n and _same(known, ends[lo + step - 1], text):
        lo += step
        step *= 2
    hi = min(lo + step - 1, n)
    while lo < hi:  # lo messages match, hi + 1 do not (or are past the end)
        mid = (lo + hi + 1) // 2
        if _same(known, ends[mid - 1], text):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _same(known: bytes, end: int, text: bytes) -> bool:
    """Whether ``text`` starts with ``known[:end]`` followed by a message boundary.
    The last bytes are compared first: another last message (a retry, another session)
    differs there, and a remembered history that is not this one is then not read
    through (it is, most likely, out of the CPU's caches)."""
    if len(text) <= end or text[end] not in (_COMMA, _CLOSE):
        return False
    lo = max(end - _PEEK, 0)
    if text[lo:end] != known[lo:end]:
        return False
    return text.startswith(memoryview(known)[:end])  # a view: nothing copied


def _key_cost(key: Key) -> int:
    return len(key[1]) + len(key[2]) + len(key[3])
