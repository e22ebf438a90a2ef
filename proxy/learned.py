"""What the proxy does with the spans a request learned (canonicalize.learn): count
them (``prefixpin_learned_spans_total{class}``) and log each new pattern once, at
INFO, with the rule that would pin it, ready to paste into ``canonicalize.rules``.

A pattern is new per tenant: the patterns one tenant's prompts taught are never
held against another's.  The rule is written only for a span whose place (its
line, the changed values masked) the tenant had not shown yet: an agent's next
turns cost a lookup.  What is logged is the rule (the span's shape and the
context around it), never the value.  Bounded: ``REMEMBERED`` places and
patterns, the least recently seen forgotten first (a forgotten one is logged
again).
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
        # (tenant, a span's place) and (tenant, a rule's pattern) seen: a place seen
        # before costs no rule to write, a pattern logged before no second line.
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def note(self, tenant: str, learned: Learned) -> None:
        """Count ``learned``'s spans; log the patterns ``tenant`` shows for the first time."""
        for span in learned.spans:
            self.metrics.learned_spans.labels(span.cls).inc()
            if span.cls == "other" or self._known((tenant, "place", span.key)):
                continue
            rule = span.rule()
            if not self._known((tenant, "rule", rule["pattern"] if rule else f"{span.scope}:{span.cls}")):
                log.info("%s", self.message(span, rule, pinned=learned.pin))

    def _known(self, key: tuple[str, str, str]) -> bool:
        """``key`` was seen (now the most recent); else it is remembered (bounded)."""
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        return False

    def message(self, span: LearnedSpan, rule: dict[str, str] | None, *, pinned: bool) -> str:
        where = {"system": "system text", "tools": "a tool description"}.get(
            span.scope, "messages before the first reply"
        )
        done = "pinned" if pinned else f"not changed (canonicalize.learn: {self.mode})"
        if rule is None:
            return f"learned a volatile {span.cls} span in the {where}, {done}; no rule fits its context"
        return (
            f"learned a volatile {span.cls} span in the {where}, {done}; "
            f"to pin it by rule, add to canonicalize.rules: {rule_yaml(rule)}"
        )


def rule_yaml(rule: dict[str, str]) -> str:
    """A rule as one line of YAML (a flow mapping), the pattern single-quoted."""
    if not all(v.isprintable() for v in rule.values()):
        text = yaml.safe_dump(rule, default_flow_style=True, sort_keys=False, width=1 << 20, allow_unicode=True)
        return text.strip()
    pattern = rule["pattern"].replace("'", "''")
    return f"{{name: {rule['name']}, pattern: '{pattern}', action: {rule['action']}, scope: {rule['scope']}}}"
