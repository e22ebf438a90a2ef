"""What a llama-server does with its slots, judged from its own ``/slots`` (section 2c,
``affinity.llama_slots``).  Pure: reads come in as data (proxy.upstream.slot_watch
does the I/O).

Naming ``id_slot`` pins a request to that slot.  Whether that helps depends on how
the server keeps prompts (llama.cpp ``tools/server/server-context.cpp``,
``get_available_slot``):

- **Its slots keep their prompts** (``--cache-ram 0``, or ``--parallel N``: each slot
  its own KV): the slot is the cache.  A request that names no slot gets the idle
  slot whose prompt shares the longest prefix with it, if that is over
  ``--slot-prompt-similarity`` (10%) of it.  Every session of an agent starts with the
  same system text, so a new session takes another session's slot, and that
  session's next turn another's in turn.  A slot per lineage stops that.  (With
  ``--parallel N`` and the RAM cache on, idle slots are also copied to the RAM cache;
  a lineage pinned to a slot that holds another's prompt gets its own restored.)
- **It clears idle slots** (its defaults: ``--parallel`` auto, 4 slots sharing one
  unified KV pool, and an 8 GiB host-RAM prompt cache): each time it starts a task
  it saves every idle slot's prompt to the RAM cache and empties the slot.  A
  request that names no slot is given the cached prompt that best matches its
  content.  A request that names a slot is given that slot, and the RAM cache is
  read only when the slot holds a prompt the request keeps less than half of,
  never when the slot is empty: an emptied slot restores nothing, and the request
  is prefilled from its first token.  Pinning there only costs.

``/props`` gives the slot count (``total_slots``), not whether the RAM cache is on;
so :class:`Judge` tells the two apart from successive reads of ``/slots``, each slot
as :class:`Slot` (``id``, ``is_processing``, ``id_task``: the task it runs or ran
last, ``n_prompt_tokens``: the prompt it holds now):

    clears   an idle slot that ran a task holds no prompt: final for this server
    keeps    a slot kept its prompt while idle across the start of another task
             (idle, with the same task and a prompt, in two reads, and a task
             newer than any in the first read started in between)
    unknown  neither yet (a fresh server)
    blind    the server has no ``/slots`` (``--no-slots``, or not a llama-server)

A server whose task ids went back (restarted) is judged afresh.  (A unified KV pool
without the RAM cache, ``--cache-ram 0`` with ``--parallel`` auto, keeps prompts,
but when the pool is full it purges idle slots one at a time: seen as ``clears``,
and prefixpin stops pinning there.)

:func:`plan` turns the verdict into what the affinity addon does
(proxy.addons.affinity):

    keeps    pin every lineage
    clears   pin none
    unknown  pin carefully: a new lineage's first request (a slot of its own: that
             spreads the sessions, so that the next reads can tell), and a lineage's
             next request when nothing else was sent since its last (its slot holds
             its prompt on either kind of server); the rest name no slot.  A fresh
             server is probed before the first request (proxy.upstream.slot_watch),
             so this is for a server whose slots could not be read or probed yet; on
             one that clears it costs once: the new lineage that shows it (pinned to
             an empty slot) misses the prefix it shares with the sessions before it
    blind    an explicit ``llama_slots: N`` pins every lineage, as configured;
             ``auto`` pins none

``llama_slots: auto`` uses ``/props``' ``total_slots`` (none before it is read, none
for a single slot); an explicit count above it is cut to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["unknown", "keeps", "clears", "blind"]
Mode = Literal["all", "careful", "none"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One slot of one ``/slots`` read."""

    id: int
    processing: bool
    task: int | None  # the task it runs or ran last; None: it never ran one
    tokens: int  # the prompt tokens it holds now

    @property
    def keeping(self) -> bool:
        """Idle, having run a task, with a prompt in it."""
        return not self.processing and self.task is not None and self.tokens > 0


def parse_slots(data: Any) -> tuple[Slot, ...] | None:
    """``/slots``' JSON as :class:`Slot` s; None when it is not a list of slots."""
    if not isinstance(data, list) or not data:
        return None
    out = []
    for item in data:
        if not isinstance(item, dict):
            return None
        sid, busy = item.get("id"), item.get("is_processing")
        task, tokens = item.get("id_task"), item.get("n_prompt_tokens", 0)
        if not (isinstance(sid, int) and isinstance(busy, bool) and _int(tokens) and (task is None or _int(task))):
            return None
        out.append(Slot(sid, busy, task, tokens))
    return tuple(out)


def parse_total(data: Any) -> int | None:
    """``/props``' ``total_slots``; None when absent."""
    total = data.get("total_slots") if isinstance(data, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _newest(slots: Sequence[Slot]) -> int:
    return max((s.task for s in slots if s.task is not None), default=-1)


def _kept(before: Sequence[Slot], now: Sequence[Slot]) -> bool:
    """A slot kept its prompt, idle, while a task started between the two reads."""
    if _newest(now) <= _newest(before):
        return False  # no task started since ``before``
    was = {s.id: s for s in before}
    for s in now:
        p = was.get(s.id)
        if s.keeping and p is not None and p.keeping and p.task == s.task:
            return True
    return False


class Judge:
    """One server's :data:`Verdict`, from each ``/slots`` read in turn."""

    def __init__(self) -> None:
        self.verdict: Verdict = "unknown"
        self._last: tuple[Slot, ...] | None = None

    def see(self, slots: tuple[Slot, ...]) -> Verdict:
        last = self._last
        restarted = last is not None and (len(slots) != len(last) or _newest(slots) < _newest(last))
        if self.verdict == "blind" or restarted:
            self.verdict, last = "unknown", None  # /slots came back, or a restarted server
        if any(not s.processing and s.task is not None and s.tokens == 0 for s in slots):
            self.verdict = "clears"
        elif self.verdict == "unknown" and last is not None and _kept(last, slots):
            self.verdict = "keeps"
        self._last = slots
        return self.verdict

    def blind(self) -> Verdict:
        """The server answered that it has no ``/slots``."""
        self.verdict, self._last = "blind", None
        return self.verdict


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """The pool's verdict: any replica that clears decides (one slot table serves them
    all, and pinning costs there); ``keeps`` once every replica that shows its slots keeps."""
    if "clears" in verdicts:
        return "clears"
    seen = [v for v in verdicts if v != "blind"]
    if not seen:
        return "blind"
    return "keeps" if all(v == "keeps" for v in seen) else "unknown"


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """What the affinity addon does: which requests it pins (``mode``), to how many slots."""

    mode: Mode
    slots: int
    why: str  # for the log


def plan(configured: int | Literal["auto"], verdict: Verdict, total: int | None) -> SlotPlan:
    """The plan for ``affinity.llama_slots: configured``, the servers' verdict and their
    slot count (``/props``; None until read or when not served)."""
    auto = configured == "auto"
    count = total if configured == "auto" else min(configured, total or configured)
    if count is None or (auto and count < 2):
        return SlotPlan("none", 0, "no slot count from /props" if count is None else "one slot")
    if verdict == "clears":
        why = "it clears idle slots into its RAM prompt cache, which restores by content; id_slot would skip that"
        return SlotPlan("none", count, why)
    if verdict == "keeps":
        return SlotPlan("all", count, "its slots keep their prompts")
    if verdict == "blind":
        if auto:
            return SlotPlan("none", count, "no /slots: whether pinning helps cannot be seen")
        return SlotPlan("all", count, "no /slots: pinning as configured")
    return SlotPlan("careful", count, "not yet seen whether its slots keep their prompts")


__all__ = ["Judge", "Mode", "Slot", "SlotPlan", "Verdict", "combine", "parse_slots", "parse_total", "plan"]
