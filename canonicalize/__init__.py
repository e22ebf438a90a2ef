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
from canonicalize.pipeline import Canonicalizer
from canonicalize.predict import Prediction, predict
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
    "AddMember",
    "Canonicalizer",
    "Decision",
    "Event",
    "Exchange",
    "Fingerprint",
    "ForkPolicy",
    "JsonDoc",
    "Kept",
    "Learned",
    "LearnedSpan",
    "LineageRecord",
    "Lookup",
    "Memos",
    "Op",
    "Outcome",
    "Pack",
    "Plan",
    "Prediction",
    "Prepared",
    "Reply",
    "Rule",
    "RuleError",
    "SSESplitter",
    "Settings",
    "Usage",
    "UsageAccumulator",
    "chain",
    "compile_rule",
    "encode",
    "match",
    "parse_usage",
    "predict",
    "render",
]
