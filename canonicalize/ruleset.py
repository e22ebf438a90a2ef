"""The rule set a canonicalizer applies, compiled once from its :class:`Settings`.

The enabled packs' rules come first, in pack order, then the user's rules; a
disabled name leaves its rule out.  The rule set sorts them by what they do and
where: *static* rules (``strip``, ``mask``) rewrite text the same way for every
request, *pin* rules (``pin``, ``date``) find spans whose values a continuation
gets back from its lineage's first request; scope ``system`` reaches the system
part, ``tools`` the tool descriptions, ``all`` both and every message.  The
packs also name the session outside the system text (request params, headers)
and add fork markers and inherited params to the ``fork`` policy.  The agents' own session headers
(``SESSION_HEADERS``) name the session whichever packs are enabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from canonicalize.lineage import ForkPolicy
from canonicalize.packs import PACKS, Pack
from canonicalize.rules import Rule

LearnMode = Literal["off", "suggest", "pin"]  # the config's canonicalize.learn (module canonicalize.learn)
# The agents' own session headers (Claude Code, Codex, opencode): every built-in pack's
# are honoured whichever packs are enabled, since a header names its session wherever
# an agent sends it (SPEC section 2d).
SESSION_HEADERS = tuple(dict.fromkeys(h for p in PACKS.values() for h in p.identity_headers))


@dataclass(frozen=True, slots=True)
class Settings:
    """What the pipeline is built from (the ``canonicalize`` and ``fork`` config)."""

    packs: tuple[str, ...] = ("generic", "hermes")
    rules: tuple[Rule, ...] = ()  # user rules, applied after the packs'
    disabled: tuple[str, ...] = ()  # rule names to leave out
    fork: ForkPolicy = field(default_factory=ForkPolicy)
    learn: LearnMode = "suggest"  # what becomes of the volatile spans learned from traffic


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules of :class:`Settings`, sorted by what they do and where (module docstring)."""

    names: tuple[str, ...]  # every rule, in order (the ``rule`` label's values)
    static_system: tuple[Rule, ...]  # scope system or all
    static_tools: tuple[Rule, ...]  # scope tools or all
    static_messages: tuple[Rule, ...]  # scope all: every message too
    pin_system: tuple[Rule, ...]
    pin_tools: tuple[Rule, ...]
    identity_params: tuple[str, ...]  # request params naming the session (first found wins)
    identity_headers: tuple[str, ...]  # and headers
    fork: ForkPolicy  # the config's, with the packs' markers and inherited params
    # A rule writes into tools[] (scope tools or all, the latter into every message
    # too): the parse is then edited in place, and no list of it may be shared.
    edits_tools: bool
    # Every system rule is line-local (canonicalize.rules): a system text is analysed
    # in the lines that differ from its conversation's previous one (canonicalize.scan).
    system_lines: bool

    @classmethod
    def compile(cls, settings: Settings) -> RuleSet:
        """The rule set of ``settings``; an unknown pack name is a ``ValueError``."""
        unknown = [p for p in settings.packs if p not in PACKS]
        if unknown:
            raise ValueError(f"unknown rule pack(s): {', '.join(unknown)} (known: {', '.join(PACKS)})")
        packs: list[Pack] = [PACKS[p] for p in settings.packs]
        rules = [r for p in packs for r in p.rules] + list(settings.rules)
        rules = [r for r in rules if r.name not in settings.disabled]
        policy = settings.fork
        static_tools = tuple(r for r in rules if r.static and r.scope in ("tools", "all"))
        static_messages = tuple(r for r in rules if r.static and r.scope == "all")
        pin_tools = tuple(r for r in rules if not r.static and r.scope in ("tools", "all"))
        static_system = tuple(r for r in rules if r.static and r.scope in ("system", "all"))
        pin_system = tuple(r for r in rules if not r.static and r.scope in ("system", "all"))
        return cls(
            names=tuple(r.name for r in rules),
            static_system=static_system,
            static_tools=static_tools,
            static_messages=static_messages,
            pin_system=pin_system,
            pin_tools=pin_tools,
            identity_params=tuple(dict.fromkeys(q for p in packs for q in p.identity_params)),
            identity_headers=tuple(dict.fromkeys((*(h for p in packs for h in p.identity_headers), *SESSION_HEADERS))),
            fork=ForkPolicy(
                enabled=policy.enabled,
                min_depth=policy.min_depth,
                markers=tuple(m for p in packs for m in p.markers) + policy.markers,
                inherit_params=tuple(
                    dict.fromkeys(policy.inherit_params + tuple(q for p in packs for q in p.inherit_params))
                ),
                guard_tools=policy.guard_tools,
            ),
            edits_tools=bool(static_tools or pin_tools or static_messages),
            system_lines=all(r.line for r in static_system + pin_system),
        )

    def session(self, body: Mapping[str, Any], headers: Mapping[str, str] | None) -> tuple[str, ...]:
        """The session named by the packs' identity params or headers (the first one found)."""
        for p in self.identity_params:
            value = body.get(p)
            if isinstance(value, str) and value:
                return (f"{p}={value}",)
        if headers is not None:
            for h in self.identity_headers:
                found = headers.get(h)
                if found:
                    return (f"header={found}",)
        return ()
