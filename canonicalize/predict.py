"""Predict the cacheable prefix of a request from its parent's, name why it broke,
and split the tokens the upstream did not serve from cache by cause.

**The parent** (:func:`parent_of`) is the deepest recorded request of the same
tenant whose history this one extends, whatever role the request gets: a
continuation's lineage, a fork's parent, the lineage its conversation went on
under (after a system edit made it a lineage of its own), or, for a request that
starts a lineage of its own while it replays a recorded conversation (it carries
an assistant message and shares recorded history), that conversation.  A request
that replays a recorded history under an edited system prompt is therefore
``system_changed``, not a fresh start.  A root that shares nothing recorded (or
only user messages: two sessions that open alike) has no parent.

**The prediction** (:func:`predict`).  The prompt is taken in the order templates
render it: system, tools[], then the messages.  The share of it (in bytes, as
forwarded) identical to the parent request's prompt is what a prefix cache can
serve.  When the prefix breaks before the end of the parent's prompt, the first
divergence names one cause:

    model_changed > system_changed > tools_changed > params_changed > history_rewritten

and the request's bytes fall in three runs, in prompt order: ``shared`` (before
the break), ``broken`` (after the break, where the parent's prompt stood: the
system part, tools[] and the first ``parent.n_messages`` messages) and ``new``
(messages the parent never sent: the appended turn).  Prediction compares what
was *forwarded*, so a break prefixpin repaired (a pinned timestamp, a fork's
system) is not a break.

**The split** (:func:`split_uncached`) of ``prompt - cached`` tokens, for a
request the upstream answered with usage.  A prefix cache serves a prefix, so the
uncached tokens are the prompt's tail: bytes are turned into tokens at the
request's own rate (``prompt_tokens / total bytes``) and the tail is taken from
the end, ``new`` first, then the break's cause, and what is left reaches into
the bytes the parent had sent: ``evicted`` (the upstream no longer had them).
A shortfall within :data:`EVICTION_SLACK` of the predicted cacheable tokens (or
:data:`EVICTION_SLACK_TOKENS`) is the byte-to-token estimate's error, not an
eviction: it goes to the break's cause, else to ``new``.  The parts are integers
that sum exactly to ``prompt - cached`` (largest remainders).  A request without
a parent is all ``new``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from canonicalize.analysis import Prepared
from canonicalize.finalize import Outcome
from canonicalize.identity import BLOCK_BYTES
from canonicalize.lineage import Fingerprint, LineageRecord, Lookup

CAUSES = ("model_changed", "system_changed", "tools_changed", "params_changed", "history_rewritten")
# prefixpin_uncached_tokens_total{cause}: the byte causes, the new content, and eviction.
UNCACHED_CAUSES = (
    "new",
    "system_changed",
    "tools_changed",
    "history_rewritten",
    "params_changed",
    "model_changed",
    "evicted",
)
# A shortfall within EVICTION_SLACK of the predicted cacheable tokens, or EVICTION_SLACK_TOKENS,
# is the byte-to-token estimate's error (a byte-level tokenizer: within 0.1%; BPE tokenizers
# read JSON and prose at different rates) or the engine's granularity (llama.cpp re-reads
# the last token, a token may straddle the prefix's end; vLLM caches 16-token blocks).
EVICTION_SLACK = 0.05
EVICTION_SLACK_TOKENS = 4


class Prediction(NamedTuple):
    """(A NamedTuple: one is made after most answered requests, at a quarter of a
    frozen dataclass' cost.)"""

    ratio: float  # shared bytes / prompt bytes
    shared: int
    total: int
    cause: str | None  # None: the request extends its parent's whole prompt
    broken: int = 0  # bytes after the break where the parent's prompt stood (0 without a cause)

    @property
    def new(self) -> int:
        """Bytes the parent never sent (the appended content)."""
        return self.total - self.shared - self.broken


@dataclass(frozen=True, slots=True)
class Parent:
    """What a request is compared with: its parent's lineage and fingerprint."""

    lineage: str  # the id of the lineage whose last request is the parent
    fingerprint: Fingerprint


def _leading_equal(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def predict(cur: Fingerprint, parent: Fingerprint, depth: int, sizes: Sequence[int]) -> Prediction:
    """``depth``: how many of this request's messages extend the parent's history."""
    head = cur.system_len + cur.tools_len
    total = head + sum(sizes)
    n = parent.n_messages
    cause: str | None = None
    if cur.model != parent.model:
        shared, cause = 0, "model_changed"
    elif cur.system_blocks is not parent.system_blocks and cur.system_blocks != parent.system_blocks:
        blocks = _leading_equal(cur.system_blocks, parent.system_blocks)  # (the same text: the same tuple)
        shared, cause = min(blocks * BLOCK_BYTES, cur.system_len), "system_changed"
    elif cur.tools != parent.tools:
        shared, cause = cur.system_len, "tools_changed"
    elif cur.params != parent.params:
        shared, cause = head, "params_changed"
    elif depth < n:
        shared, cause = head + sum(sizes[:depth]), "history_rewritten"
    else:
        shared = head + sum(sizes[:n])
    if cause is None:
        return Prediction(shared / total if total else 1.0, shared, total, None)
    covered = head + sum(sizes[:n])  # where the parent's prompt stood in this one
    return Prediction(shared / total if total else 1.0, shared, total, cause, max(covered - shared, 0))


def parent_of(outcome: Outcome, prep: Prepared, lookup: Lookup | None) -> Parent | None:
    """The request a request is compared with: the deepest recorded request of the
    tenant whose history it extends, whatever role it got; None: nothing recorded
    precedes it.  ``lookup`` is what the store found for its chain; each lineage
    in it stands for its last request.

    - The request's own lineage (a continuation's, a fork's parent) when it owns
      the deepest link the request shares (it may have gone further: the request
      rewinds or rewrites an earlier message: ``history_rewritten``).
    - Else, for a request with a lineage of its own: the most recent lineage
      owning that deepest link whose whole history the request extends (its
      conversation went on under another lineage, e.g. after a system edit); if
      none, its own lineage (what went further is a side conversation: a fork,
      another session's replay).
    - Else (a root that carries an assistant message: it replays a recorded
      conversation): the most recent lineage of the same session (identity, else
      skeleton) owning that link, else the most recent owning it.  A root without
      an assistant message (a conversation's first request) has no parent: two
      sessions that open alike share nothing.
    """
    own: Parent | None = None
    if outcome.parent_fp is not None:
        rec = outcome.record
        own = Parent(rec.parent if outcome.fork_action == "repaired" and rec.parent else rec.id, outcome.parent_fp)
    if lookup is None or lookup.depth == 0:
        return own
    first = lookup.candidates[0] if lookup.candidates else None
    if (
        own is not None
        and first is not None
        and first.id == own.lineage
        and first.fingerprint is not None
        and lookup.depth_of(0) == lookup.depth
    ):
        return own  # its own lineage owns the deepest link (a continuation): as below, without the lists
    if own is None and prep.signals.first_assistant is None:
        return None
    found = [(rec, lookup.depth_of(i)) for i, rec in enumerate(lookup.candidates) if rec.fingerprint is not None]
    if not found:
        return own
    deepest = max(depth for _, depth in found)
    furthest = [rec for rec, depth in found if depth == deepest]  # most recent first (the store's order)
    if own is not None:
        if any(rec.id == own.lineage for rec in furthest):
            return own
        whole = [rec for rec in furthest if rec.fingerprint is not None and rec.fingerprint.n_messages <= deepest]
        return _parent(whole[0]) if whole else own
    sig = prep.signals

    def same(rec: LineageRecord) -> bool:
        if sig.identity and rec.identity:
            return sig.identity == rec.identity
        return sig.skeleton == rec.skeleton

    return _parent(next((rec for rec in furthest if same(rec)), furthest[0]))


def _parent(rec: LineageRecord) -> Parent:
    assert rec.fingerprint is not None
    return Parent(rec.id, rec.fingerprint)


def split_uncached(p: Prediction | None, prompt: int, cached: int) -> dict[str, int]:
    """``prompt - cached`` tokens by cause (module docstring): integers that sum to it
    exactly; ``p`` None: a request without a parent, all ``new``."""
    uncached = max(prompt - cached, 0)
    if uncached == 0:
        return {}
    if p is None or p.total <= 0 or prompt <= 0:
        return {"new": uncached}
    scale = prompt / p.total
    new = min(float(uncached), p.new * scale)
    broken = min(uncached - new, p.broken * scale)
    evicted = uncached - new - broken
    if evicted <= max(EVICTION_SLACK_TOKENS, EVICTION_SLACK * p.shared * scale):
        if p.cause is not None:
            broken += evicted
        else:
            new += evicted
        evicted = 0.0
    if p.cause is None and not evicted:
        return {"new": uncached}  # the usual turn: nothing but new content to split
    parts = {"new": new, "evicted": evicted}
    if p.cause is not None:
        parts[p.cause] = broken
    else:
        parts["new"] += broken
    return _largest_remainder(parts, uncached)


def _largest_remainder(parts: dict[str, float], total: int) -> dict[str, int]:
    """Integers, each the floor of its part or one more, that sum to ``total``: the
    units left after the floors go to the largest fractional parts (ties: in
    UNCACHED_CAUSES order).  (Runs after most answered requests: plain arithmetic on
    at most three parts, no key function.)"""
    floors: dict[str, int] = {}
    order: list[tuple[float, int, str]] = []
    left = total
    for k, v in parts.items():
        if v < 0.0:
            v = 0.0
        f = int(v)  # the floor: v >= 0
        floors[k] = f
        left -= f
        order.append((f - v, _RANK[k], k))  # the largest fraction first, then the causes' order
    if left > 0:
        order.sort()
        for _, _, k in order[:left]:
            floors[k] += 1
    return {k: v for k, v in floors.items() if v}


_RANK = {cause: i for i, cause in enumerate(UNCACHED_CAUSES)}
