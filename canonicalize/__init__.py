"""Pure request canonicalization: rules, packs, the hash chain, lineage decisions,
and the response state machines.  No I/O, no asyncio, no clock reads: time and
randomness come in as arguments.  Nothing here imports from ``proxy``.
"""

from __future__ import annotations

from canonicalize.lineage import Decision, Fingerprint, ForkPolicy, LineageRecord, Lookup
from canonicalize.packs import PACKS, Pack
from canonicalize.pipeline import (
    Canonicalizer,
    Outcome,
    Prepared,
    Settings,
    blobs_needed,
    ensure_stream_usage,
)
from canonicalize.rules import Rule, RuleError, compile_rule
from canonicalize.shape import ANTHROPIC, OPENAI, Dialect

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "PACKS",
    "Canonicalizer",
    "Decision",
    "Dialect",
    "Fingerprint",
    "ForkPolicy",
    "LineageRecord",
    "Lookup",
    "Outcome",
    "Pack",
    "Prepared",
    "Rule",
    "RuleError",
    "Settings",
    "blobs_needed",
    "compile_rule",
    "ensure_stream_usage",
]
