"""What the proxy does with the spans a request learned (canonicalize.learn): count
them (``prefixpin_learned_spans_total{class}``) and log each new pattern once, at
INFO, with the rule that would pin it, ready to paste into ``canonicalize.rules``.

A pattern is new per tenant: the patterns one tenant's prompts taught are never
held against another's.  What is logged is the rule (the span's shape and the
context around it), never the value.  Bounded: ``REMEMBERED`` patterns, the
least recently seen forgotten first (a forgotten one is logged again).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import yaml

from canonicalize import Learned, LearnedSpan
from proxy.metrics import Metrics

log = logging.getLogger("prefixpin")
REMEMBERED = 4096


class Suggestions:
    """Counts learned spans and logs each tenant's new patterns once (module docstring)."""

    def __init__(self, metrics: Metrics, mode: str) -> None:
        self.metrics = metrics
        self.mode = mode
        self._seen: OrderedDict[tuple[str, str, str, str | None], None] = OrderedDict()

    def note(self, tenant: str, learned: Learned) -> None:
        """Count ``learned``'s spans; log the patterns ``tenant`` shows for the first time."""
        for span in learned.spans:
            self.metrics.learned_spans.labels(span.cls).inc()
            if span.cls == "other":
                continue
            key = (tenant, span.scope, span.cls, span.pattern)
            if key in self._seen:
                self._seen.move_to_end(key)
                continue
            self._seen[key] = None
            if len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
            log.info("%s", self.message(span))

    def message(self, span: LearnedSpan) -> str:
        where = "system text" if span.scope == "system" else "a tool description"
        done = "pinned" if self.mode == "pin" else "not changed (canonicalize.learn: suggest)"
        if span.pattern is None:
            return f"learned a volatile {span.cls} span in the {where}, {done}; no rule fits its context"
        return (
            f"learned a volatile {span.cls} span in the {where}, {done}; "
            f"to pin it by rule, add to canonicalize.rules: {rule_yaml(span)}"
        )


def rule_yaml(span: LearnedSpan) -> str:
    """The span's rule as one line of YAML (a flow mapping)."""
    text = yaml.safe_dump(span.rule(), default_flow_style=True, sort_keys=False, width=1 << 20, allow_unicode=True)
    return text.strip()
