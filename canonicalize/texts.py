"""Big texts seen again, found without hashing them, and what was derived from them.

An agent sends the same system prompt turn after turn, each time as a new ``str``
parsed from the request.  Python hashes a ``str`` on its first use as a dict key
(a pass over the whole text) and encodes it to UTF-8 on its first serialization;
both are cached *in the object*, so they are paid again by every request's new
copy.  :class:`Texts` keeps one object per distinct text and hands it back for
an equal one: a request whose slots hold the kept object then finds it in other
memos, serializes and hashes it at the cost of a lookup.  Each kept text also
carries values derived from it (its rule analysis, pin spans, restored pins,
fingerprint blocks, system ref), computed once and stored through
:meth:`Texts.derive`, which counts what they hold in the bound.

A text is found by a cheap key (its length, its first and its last characters)
and verified by comparing it whole with the kept one: a text that merely shares
the key is a miss, never another text.  The kept object itself (which the caller
got from here and put back in a request) is found by identity, in O(1).  The memo is keyed by scope (the tenant)
as well, so one tenant's requests never find, nor can time, another's texts.  It
is bounded in texts (``MAX_ENTRIES``), in characters (``MAX_CHARS``, the texts and
what was derived from them) and in texts per key (``PER_KEY``).  Past a bound the least
recently used key goes first, but a text that its conversation's next prompt was read
from (:meth:`Texts.supersede`) goes before it: such a text is seldom sent again, and
freed at once what it holds is still in the CPU's caches, where a text left to age out
is freed cold (in process, ~15 µs of a request when 64 conversations change their
prompts every turn: ``bench_inprocess``'s mix).

Safe to share between threads (a big body is prepared and finalized on a worker
thread while the event loop serves the others): the buckets change under a lock;
what was derived is read without it and stored under it (the first value stored
wins, and is charged once); a text's bounded list of restored pins is a tuple
replaced whole.  ``Texts(enabled=False)`` remembers nothing: every entry is new
and empty, so every value is derived afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, TypeVar

Key = tuple[str, int, str, str]  # scope, length, head, tail
MAX_ENTRIES = 512
MAX_CHARS = 16 * 2**20
PER_KEY = 4  # distinct texts kept per key (a prompt whose minute changes keeps its length, head and tail)
HEAD = 64  # characters of the start that go into the key
TAIL = 256  # and of the end (where an agent's prompt keeps what changes: a date, a session)
V = TypeVar("V")


class Entry:
    """A kept text and what was derived from it (by the caller, by name)."""

    __slots__ = ("derived", "extra", "kept", "key", "text")

    def __init__(self, key: Key, text: str) -> None:
        self.key = key  # (scope, ...): see Texts.entry
        self.text = text
        self.derived: dict[Any, Any] = {}
        self.extra = 0  # characters ``derived`` holds (Texts.charge)
        self.kept = False  # in the memo, counted in its bounds


class Texts:
    """The bounded memo of big texts (see the module docstring); safe to share between
    threads (a big body is finalized on a worker thread)."""

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_chars: int = MAX_CHARS,
        per_key: int = PER_KEY,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.per_key = per_key
        self._buckets: OrderedDict[Key, list[Entry]] = OrderedDict()
        # id() of each kept text: valid while its entry holds the object (ids are reused only after a free)
        self._ids: dict[int, Entry] = {}
        self._newest: Entry | None = None  # the entry whose key was last moved to the end (or added)
        self._entries = 0
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._entries

    @property
    def chars(self) -> int:
        """Characters held."""
        return self._chars

    def entry(self, scope: str, text: str) -> Entry:
        """The entry of ``text`` in ``scope``: the kept one if an equal text is kept, else
        a new one (kept unless it is too big to, or the memo is off)."""
        if not self.enabled:
            return Entry((scope, len(text), "", ""), text)
        found = self._ids.get(id(text))
        if found is not None and found.text is text and found.key[0] == scope:
            if found is not self._newest:  # (the newest used is at the end already)
                with self._lock:
                    if found.key in self._buckets:
                        self._buckets.move_to_end(found.key)
                        self._newest = found
            return found  # the kept object itself: nothing to compare
        key = (scope, len(text), text[:HEAD], text[-TAIL:])
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is not None:
                for i, found in enumerate(bucket):
                    if found.text == text:
                        if i:
                            bucket.insert(0, bucket.pop(i))
                        self._buckets.move_to_end(key)
                        self._newest = found
                        return found
            entry = Entry(key, text)
            cost = len(text) + len(scope)
            if cost > self.max_chars // 8:
                return entry  # used once, not kept
            if bucket is None:
                bucket = self._buckets[key] = []
            else:
                self._buckets.move_to_end(key)
            bucket.insert(0, entry)
            self._ids[id(text)] = entry
            self._newest = entry
            entry.kept = True
            self._entries += 1
            self._chars += cost
            while len(bucket) > self.per_key:
                self._forget(key, bucket.pop())
            self._shrink()
            return entry

    def supersede(self, entry: Entry) -> None:
        """``entry``'s text was followed by another read from it (a conversation's next
        system prompt: :func:`canonicalize.analysis.prepare`): it goes first when the memo is
        over its bounds, while what it holds is still in the CPU's caches (a text left to
        age out is freed cold, its derived values read back from memory one by one).  Used
        again, it is the newest again.  Only a text alone under its key is moved (its key
        holds no other text that may still be in use)."""
        with self._lock:
            bucket = self._buckets.get(entry.key)
            if bucket is not None and len(bucket) == 1 and bucket[0] is entry:
                self._buckets.move_to_end(entry.key, last=False)
                if self._newest is entry:
                    self._newest = None

    def known(self, scope: str, text: str) -> Entry | None:
        """The entry of ``text`` in ``scope`` when this very object is kept (found by
        identity: nothing compared, nothing made); None otherwise."""
        if not self.enabled:
            return None
        found = self._ids.get(id(text))
        return found if found is not None and found.text is text and found.key[0] == scope else None

    def _shrink(self) -> None:
        while self._buckets and (self._entries > self.max_entries or self._chars > self.max_chars):
            old_key, old_bucket = self._buckets.popitem(last=False)
            for old in old_bucket:
                self._forget(old_key, old)

    def charge(self, entry: Entry, chars: int) -> None:
        """Count ``chars`` more held by ``entry`` (what was derived from it) in the bound."""
        with self._lock:
            self._charge(entry, chars)

    def _charge(self, entry: Entry, chars: int) -> None:
        entry.extra += chars
        if not entry.kept:
            return  # not kept (or forgotten): it goes with its request
        self._chars += chars
        self._shrink()

    def derive(self, entry: Entry, key: Hashable, value: V, chars: int = 0) -> V:
        """``value`` stored as derived from ``entry``'s text under ``key`` (the caller found
        none there), the ``chars`` it holds beyond the text counted in the bound.  When
        another thread stored one first, that one (an equal value: both were derived
        from the same text) is returned and nothing is charged twice."""
        with self._lock:
            found: V | None = entry.derived.get(key)
            if found is not None:
                return found
            entry.derived[key] = value
            if chars:
                self._charge(entry, chars)
        return value

    @staticmethod
    def found_among(entry: Entry, key: Hashable, item: Hashable) -> Any:
        """The value stored under ``item`` in ``entry``'s list ``key`` (``derive_among``), or None."""
        for known, value, _ in entry.derived.get(key, ()):
            if known == item:
                return value
        return None

    def derive_among(self, entry: Entry, key: Hashable, item: Hashable, value: V, chars: int, *, most: int) -> V:
        """``value`` stored under ``item`` in ``entry``'s list ``key``, newest first, ``most``
        kept (the oldest dropped and uncharged), the ``chars`` each holds counted.  The
        list is a tuple replaced whole under the lock: a reader sees it before or after."""
        with self._lock:
            listed: tuple[tuple[Hashable, Any, int], ...] = entry.derived.get(key, ())
            for known, found, _ in listed:
                if known == item:
                    return found  # type: ignore[no-any-return]
            kept, dropped = ((item, value, chars), *listed[: most - 1]), listed[most - 1 :]
            entry.derived[key] = kept
            self._charge(entry, chars - sum(c for _, _, c in dropped))
        return value

    def intern(self, scope: str, text: str) -> str:
        """The kept object equal to ``text`` (``text`` itself when new)."""
        return self.entry(scope, text).text

    def _forget(self, key: Key, entry: Entry) -> None:
        if entry is self._newest:
            self._newest = None
        if self._ids.get(id(entry.text)) is entry:
            del self._ids[id(entry.text)]
        entry.kept = False
        self._entries -= 1
        self._chars -= len(entry.text) + len(key[0]) + entry.extra
