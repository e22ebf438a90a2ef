"""Every memo of the core, in one object: :class:`Memos`.

An agent sends the same system prompt, tools and history turn after turn, each
time as new bytes.  Each memo remembers one kind of answer about them, so that a
request pays only for what is new in it:

=============  ====================================================  =========================================
memo           remembers                                             bound
=============  ====================================================  =========================================
``texts``      big system texts, one object per distinct text, and   512 texts, 16 Mi characters (with what
               what was derived from each: its rule analysis, pin    was derived), 4 texts per key, 8 sets of
               spans, restored pins, fingerprint blocks, system ref  restored pins per text
               (:mod:`canonicalize.texts`)
``histories``  hashed histories, as their JSON and their links       4,096 histories, 32 MiB, 8 per first
               (:mod:`canonicalize.histories`)                       message
``bodies``     the newest body of each conversation in flight and   512 bodies, 256 per tenant, 16 MiB of
               its parse, to parse the next one by pieces           bodies, 4 per lead item
               (:mod:`canonicalize.bodies`)
``tools``      the :class:`~canonicalize.identity.ToolsId` of a      256 lists and 16 MiB by their bytes,
               tools[] by its bytes, and by the identity of a kept   256 lists and 16 MiB (their bytes)
               body's list (:class:`ToolIds`)                        held by identity
=============  ====================================================  =========================================

The memos are the core's long-lived state: one :class:`Memos` per canonicalizer,
passed explicitly to the functions that use it (``analysis.prepare(rules, memos,
...)``, ``finalize.finalize(rules, memos, ...)``), changed by every request that
passes.  What the functions return does not depend on it: an answer found is
verified against the content it stands for (compared whole, byte for byte, or by
the identity of an object the memo holds), and is the answer computed afresh.
Every memo is keyed by scope (the tenant) where what it holds came from a
request, so one tenant's requests never find, nor can time, another's.
:meth:`Memos.off` is the no-memo form: every answer computed afresh; the tests
compare the two.

Every memo is safe to share between threads: big bodies are prepared and
finalized on worker threads while the event loop serves the others.  What one
thread may change while another reads is changed under the memo's lock, or is
immutable and replaced whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from canonicalize import chain
from canonicalize.bodies import Bodies
from canonicalize.histories import Histories
from canonicalize.identity import ToolsId, identify_tools, tools_form
from canonicalize.texts import Texts
from canonicalize.wire.base import Exchange

TOOL_LISTS = 256  # tool lists whose identity is remembered by their bytes, and lists held by identity
TOOL_BYTES = 16 * 2**20  # the bytes of the lists remembered, and of those held (a list over an eighth: neither)


class ToolIds:
    """The bounded memo of tool lists' identities (see the module docstring)."""

    def __init__(self, *, max_entries: int = TOOL_LISTS, max_bytes: int = TOOL_BYTES, enabled: bool = True) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.enabled = enabled
        # Keyed by the tenant, the wire API and the digest (cheap to hash), verified against
        # the bytes (a digest collision is a miss, never another list's meaning).
        self._by_form: OrderedDict[tuple[str, str, str], tuple[bytes, ToolsId]] = OrderedDict()
        self._form_bytes = 0
        # By id(): kept bodies' lists, which no rule writes to; the entry holds the list,
        # so the id stays its own (oldest popped in O(1)), and its bytes' length.
        self._held: OrderedDict[int, tuple[list[Any], str, str, ToolsId, int]] = OrderedDict()
        self._held_bytes = 0
        self._lock = threading.Lock()

    def identify(
        self, exchange: Exchange, tool_list: list[Any], *, hold: bool, shared: bool, scope: str = ""
    ) -> ToolsId | None:
        """What identifies ``tool_list`` (None: it cannot be hashed, see
        :func:`~canonicalize.identity.tools_form`), remembered for ``scope`` (the tenant)
        only.  ``shared``: no rule writes to the lists of kept bodies, so a list held
        before is answered by its identity.  ``hold``: the list is a kept body's, which
        the session's next body may share."""
        if shared and self.enabled:
            with self._lock:
                held = self._held.get(id(tool_list))
            if held is not None and held[0] is tool_list and held[1] == exchange.name and held[2] == scope:
                return held[3]
        form = tools_form(tool_list)
        if form is None:
            return None
        ref = chain.digest(form)
        key = (scope, exchange.name, ref)
        found = self._find(key, form)
        if found is None:
            found = identify_tools(exchange, tool_list, form, ref)
            self._remember(key, form, found)
        if hold and shared and self.enabled and len(form) <= self.max_bytes // 8:
            # Only a kept body's list: any other is never seen again, and holding it would
            # only move the freeing of its parse to a later request, its memory gone cold.
            with self._lock:
                old = self._held.pop(id(tool_list), None)
                if old is not None:
                    self._held_bytes -= old[4]
                self._held[id(tool_list)] = (tool_list, exchange.name, scope, found, len(form))
                self._held_bytes += len(form)
                while len(self._held) > self.max_entries or self._held_bytes > self.max_bytes:
                    self._held_bytes -= self._held.popitem(last=False)[1][4]
        return found  # frozen: the same object serves every request that sends these bytes

    def _find(self, key: tuple[str, str, str], form: bytes) -> ToolsId | None:
        if not self.enabled:
            return None
        with self._lock:
            hit = self._by_form.get(key)
            if hit is None or hit[0] != form:
                return None
            self._by_form.move_to_end(key)
            return hit[1]

    def _remember(self, key: tuple[str, str, str], form: bytes, found: ToolsId) -> None:
        if not self.enabled or len(form) > self.max_bytes // 8:
            return  # (a list this big is remembered by nothing: it would push out the others)
        with self._lock:
            old = self._by_form.pop(key, None)
            if old is not None:
                self._form_bytes -= len(old[0])
            self._by_form[key] = (form, found)
            self._form_bytes += len(form)
            while len(self._by_form) > self.max_entries or self._form_bytes > self.max_bytes:
                self._form_bytes -= len(self._by_form.popitem(last=False)[1][0])

    @property
    def size(self) -> int:
        """Bytes of the lists remembered and held."""
        return self._form_bytes + self._held_bytes


@dataclass(frozen=True, slots=True)
class Memos:
    """The core's memos (see the module docstring); one per canonicalizer."""

    texts: Texts = field(default_factory=Texts)
    histories: Histories = field(default_factory=Histories)
    bodies: Bodies = field(default_factory=Bodies)
    tools: ToolIds = field(default_factory=ToolIds)

    @classmethod
    def off(cls) -> Memos:
        """Memos that remember nothing: every answer is computed afresh."""
        return cls(Texts(enabled=False), Histories(enabled=False), Bodies(enabled=False), ToolIds(enabled=False))
