"""Pure request canonicalization: rules, packs, the hash chain, lineage decisions,
edits spliced into the raw bytes, and one exchange per wire API with its
response state machine.  No I/O, no asyncio, no clock reads: time and randomness
come in as arguments.  Nothing here imports from ``proxy``.
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
