"""Predict the cacheable prefix of a request from its parent's, and why it broke.

The prompt is taken in the order templates render it: system, tools[], then the
messages.  The share of it (in bytes, as sent) identical to the parent request's
prefix is what a prefix cache can serve.  When the prefix breaks before the end
of the parent's prompt, the first divergence names one cause:

    model_changed > system_changed > tools_changed > params_changed > history_rewritten

Prediction compares what was *forwarded*, so a break prefixpin repaired (a pinned
timestamp, a fork's system) is not a break.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from canonicalize.identity import BLOCK_BYTES
from canonicalize.lineage import Fingerprint

CAUSES = ("model_changed", "system_changed", "tools_changed", "params_changed", "history_rewritten")


@dataclass(frozen=True, slots=True)
class Prediction:
    ratio: float  # shared bytes / prompt bytes
    shared: int
    total: int
    cause: str | None  # None: the request extends its parent's whole prompt


def _leading_equal(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def predict(cur: Fingerprint, parent: Fingerprint, depth: int, sizes: Sequence[int]) -> Prediction:
    """``depth``: how many of this request's messages extend the parent's history."""
    messages = sum(sizes)
    total = cur.system_len + cur.tools_len + messages
    head = cur.system_len + cur.tools_len
    shared_msgs = sum(sizes[: min(depth, parent.n_messages)])
    cause: str | None = None
    if cur.model != parent.model:
        shared, cause = 0, "model_changed"
    elif cur.system_blocks != parent.system_blocks:
        blocks = _leading_equal(cur.system_blocks, parent.system_blocks)
        shared, cause = min(blocks * BLOCK_BYTES, cur.system_len), "system_changed"
    elif cur.tools != parent.tools:
        shared, cause = cur.system_len, "tools_changed"
    elif cur.params != parent.params:
        shared, cause = head, "params_changed"
    elif depth < parent.n_messages:
        shared, cause = head + shared_msgs, "history_rewritten"
    else:
        shared = head + shared_msgs
    return Prediction(shared / total if total else 1.0, shared, total, cause)
