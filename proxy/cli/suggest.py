"""``prefixpin audit TRACE --suggest-rules``: the rules that pin what learning found.

The trace goes through the same flow as ``prefixpin audit`` with
``canonicalize.learn: pin``; every span a request learned (canonicalize.learn)
with a rule to pin it becomes one rule, the same pattern learned twice one rule.
The output is a config document: the config's own ``canonicalize`` section (its
packs and rules, when not the defaults) with those rules after its own.  Used as
the config, with ``learn: off`` (or the default ``suggest``, which changes
nothing), the rules stabilize the trace the way ``learn: pin`` does: they pin the
same spans to the values a lineage started with, and a ``date`` rule (a time or a
date) tells the model the current value in the same note.

One difference: learning carries a lineage's values across a request that also
edited its prompt (the edit is sent as is, the values stay pinned); a rule cannot
tell such a request from another session's, so with rules it starts a lineage of
its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import yaml

from canonicalize import PACKS
from proxy.cli.progress import Progress
from proxy.cli.trace import TraceLine
from proxy.config import Canonicalize, Config
from proxy.offline import Offline


async def learned_rules(
    lines: Iterable[TraceLine], config: Config, progress: Progress
) -> tuple[list[dict[str, str]], int, int]:
    """The rules learned from ``lines`` with ``learn: pin`` (one per pattern, first seen
    first), at how many places a learned value had no rule that could be written, and
    how many lines were read (one at a time)."""
    config = replace(
        config,
        canonicalize=replace(config.canonicalize, learn="pin"),
        tenancy=replace(config.tenancy, anonymous="shared"),  # as audit: a trace's keyless lines are one user's
    )
    offline = Offline(config)
    taken = {r.name for r in config.canonicalize.rules} | {r.name for p in PACKS.values() for r in p.rules}
    rules: dict[tuple[str, str, str], dict[str, str]] = {}
    places: set[str] = set()
    unwritten = read = 0
    for line in lines:
        progress.advance(line.line - progress.done)
        read += 1
        flow = await offline.send(
            line.body,
            exchange=line.exchange,
            headers=line.headers,
            query=urlsplit(line.path).query,
            reply=line.reply,
        )
        for span in flow.outcome.learned if flow.outcome is not None else ():
            if span.cls == "other" or span.key in places:
                continue
            places.add(span.key)
            rule = span.rule()
            if rule is None:
                unwritten += 1
                continue
            key = (rule["pattern"], rule["action"], rule["scope"])
            if key not in rules:
                rules[key] = _named(rule, taken)
    return list(rules.values()), unwritten, read


def _named(rule: dict[str, str], taken: set[str]) -> dict[str, str]:
    """``rule``, its name made unique among ``taken`` (which it joins)."""
    name, n = rule["name"], 1
    while name in taken:
        n += 1
        name = f"{rule['name']}_{n}"
    taken.add(name)
    return {**rule, "name": name}


def document(rules: list[dict[str, str]], config: Config, path: str, requests: int, unwritten: int) -> str:
    """The YAML config document: the config's canonicalize section, the learned rules after its own."""
    own = config.canonicalize
    section: dict[str, Any] = {}
    if own.packs != Canonicalize().packs:
        section["packs"] = list(own.packs)
    section["rules"] = [_plain(r) for r in own.rules] + rules
    if own.disable:
        section["disable"] = list(own.disable)
    head = [
        f"# prefixpin audit --suggest-rules {path}",
        f"# {len(rules)} rule(s) learned from {requests} request(s) with canonicalize.learn: pin.",
        "# Use as the config (or add the rules to yours); with these rules, learn: off pins the same spans.",
    ]
    if unwritten:
        head.append(f"# {unwritten} place(s) of a learned value had no context a rule could anchor on: left out.")
    body = yaml.safe_dump({"canonicalize": section}, sort_keys=False, allow_unicode=True, width=1 << 20)
    return "\n".join(head) + "\n" + body


def _plain(rule: Any) -> dict[str, Any]:
    out = {"name": rule.name, "pattern": rule.pattern, "action": rule.action, "scope": rule.scope}
    if rule.identity:
        out["identity"] = True
    if rule.action == "mask":
        out["replacement"] = rule.replacement
    return out
