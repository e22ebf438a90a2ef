"""Request canonicalization: rules, packs, the hash chain, lineage decisions,
edits spliced into the raw bytes, and one exchange per wire API with its
response state machine.

No I/O, no asyncio, no clock reads: the request machine (:mod:`canonicalize.pipeline`)
asks the shell for what only the store has (:mod:`canonicalize.needs`), and time
and randomness come in as arguments or answers.  The core's functions are pure
over explicit state that the caller creates and passes in: the compiled rule set,
and the memos (:mod:`canonicalize.memo`), long-lived objects that remember what
earlier requests cost so that the next one pays only for what is new.  A memo
changes as requests pass, but no answer depends on it: each one is verified
against the content it stands for and is the answer ``Memos.off()`` (no memo)
computes.  Nothing here imports from ``proxy``.
"""

from __future__ import annotations

from canonicalize import chain
from canonicalize.analysis import Prepared
from canonicalize.bodies import Kept
from canonicalize.edits import AddMember, Op, render
from canonicalize.evidence import Evidence, evidence, places
from canonicalize.finalize import Outcome
from canonicalize.jsonspan import JsonDoc
from canonicalize.learn import Learned, Plan
from canonicalize.lineage import (
    CANDIDATES,
    LINKS_PER_KEY,
    SCAN_UP,
    Decision,
    Fingerprint,
    ForkPolicy,
    LineageRecord,
    Lookup,
)
from canonicalize.memo import Memos
from canonicalize.packs import PACKS, Pack
from canonicalize.pipeline import Canonicalized, Canonicalizer, Machine, Request
from canonicalize.predict import UNCACHED_CAUSES, Parent, Prediction, parent_of, predict, split_uncached
from canonicalize.rules import Rule, RuleError, compile_rule
from canonicalize.ruleset import Settings
from canonicalize.spans import Span as LearnedSpan
from canonicalize.sse import Event, SSESplitter, encode
from canonicalize.usage import Usage, UsageAccumulator, parse_usage
from canonicalize.wire import CHAT, EXCHANGES, MESSAGES, RESPONSES, Exchange, Reply, match

__all__ = [
    "CANDIDATES",
    "CHAT",
    "EXCHANGES",
    "LINKS_PER_KEY",
    "MESSAGES",
    "PACKS",
    "RESPONSES",
    "SCAN_UP",
    "UNCACHED_CAUSES",
    "AddMember",
    "Canonicalized",
    "Canonicalizer",
    "Decision",
    "Event",
    "Evidence",
    "Exchange",
    "Fingerprint",
    "ForkPolicy",
    "JsonDoc",
    "Kept",
    "Learned",
    "LearnedSpan",
    "LineageRecord",
    "Lookup",
    "Machine",
    "Memos",
    "Op",
    "Outcome",
    "Pack",
    "Parent",
    "Plan",
    "Prediction",
    "Prepared",
    "Reply",
    "Request",
    "Rule",
    "RuleError",
    "SSESplitter",
    "Settings",
    "Usage",
    "UsageAccumulator",
    "chain",
    "compile_rule",
    "encode",
    "evidence",
    "match",
    "parent_of",
    "parse_usage",
    "places",
    "predict",
    "render",
    "split_uncached",
]
