"""``prefixpin audit TRACE.jsonl``: what prefixpin would do to a recorded trace, offline.

Each request goes through the same canonicalizer and lineage logic as the proxy,
against an embedded store; nothing is sent anywhere.  For every request with a
parent (the previous request of its lineage, or a fork's parent) the predicted
cacheable prefix is computed twice: as the agent sent it (*before*) and as
prefixpin would forward it (*after*), with the first divergence named by cause.
Roots count as fully uncached.  A trace line may carry the upstream's reply under
``"response"`` (an assistant message or a whole completion); it is recorded like
the proxy records real replies.  Unknown keys are ignored; a malformed line is
reported with its number and skipped.

The saving: predicted cacheable bytes are turned into tokens at
:data:`BYTES_PER_TOKEN` (an estimate: compact JSON of English text and code runs
at about 4 bytes per token; real tokenizers differ by model and content, so treat
it as +-30%) and priced as ``prefixpin_saved_usd_total`` prices what a provider
reports (:func:`proxy.pricing.saved`, the ``provider_cache.prices``, else LiteLLM's
local cost map): the cached tokens' saving (input minus cached-input price) minus
the cache writes' extra cost (cache-write minus input price), every uncached token
taken as written once (a cache that keeps what it is sent), at the 5-minute write
price (the audit does not model TTLs): what a provider cache would save on this
trace as the agent sent it and as prefixpin forwards it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, TextIO
from urllib.parse import urlsplit

from canonicalize import Exchange, Fingerprint, Usage, predict
from proxy.cli import suggest
from proxy.cli.progress import Progress
from proxy.cli.trace import TraceError, TraceLine, read_trace
from proxy.config import Config
from proxy.offline import Offline
from proxy.pricing import Pricing, saved

BYTES_PER_TOKEN = 4  # the estimate behind the audit's dollar figures (module docstring)


@dataclass
class Tally:
    requests: int = 0
    total: int = 0
    before: int = 0
    after: int = 0
    breaks_before: Counter[str] = field(default_factory=Counter)
    breaks_after: Counter[str] = field(default_factory=Counter)

    def add(self, total: int, before: int, after: int, cause_before: str | None, cause_after: str | None) -> None:
        self.requests += 1
        self.total += total
        self.before += before
        self.after += after
        if cause_before:
            self.breaks_before[cause_before] += 1
        if cause_after:
            self.breaks_after[cause_after] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_bytes": self.total,
            "cacheable_before": round(self.before / self.total, 4) if self.total else 0.0,
            "cacheable_after": round(self.after / self.total, 4) if self.total else 0.0,
            "breaks_before": dict(self.breaks_before),
            "breaks_after": dict(self.breaks_after),
        }


@dataclass
class Lineage:
    id: str
    kind: str
    parent: str | None
    tally: Tally = field(default_factory=Tally)
    last_raw: tuple[Fingerprint, int] | None = None  # as received, with its message count


def _reply_of(line: TraceLine, exchange: Exchange) -> dict[str, Any] | None:
    resp = line.extra.get("response")
    if not isinstance(resp, dict):
        return None
    if isinstance(resp.get("choices"), list) and resp["choices"]:  # a whole chat completion
        msg = resp["choices"][0].get("message")
        return msg if isinstance(msg, dict) else None
    if resp.get("type") == "message" and "content" in resp:  # a whole Anthropic message
        return {"role": "assistant", "content": resp["content"]}
    if isinstance(resp.get("output"), list):  # a whole Responses response (its id: previous_response_id)
        out: dict[str, Any] = {"role": "assistant", "output": resp["output"]}
        if isinstance(resp.get("id"), str):
            out["id"] = resp["id"]
        return out
    return resp if resp.get("role") == "assistant" else None


async def audit(lines: list[TraceLine], config: Config, progress: Progress, errors: TextIO) -> dict[str, Any]:
    # A trace's credentials are usually stripped: its anonymous lines are one user's.
    # Its time is the trace's (``t``): a lineage's pauses are the ones it recorded.
    now = [0.0]
    offline = Offline(replace(config, tenancy=replace(config.tenancy, anonymous="shared")), clock=lambda: now[0])
    lineages: dict[str, Lineage] = {}
    total = Tally()
    by_model: dict[str, list[int]] = {}  # model -> [cacheable bytes before, after, prompt bytes]
    for line in lines:
        progress.advance()
        now[0] = line.t
        exchange = line.exchange
        raw_fp, raw_sizes = offline.s.canon.measure(line.body, exchange)
        flow = await offline.send(
            line.body,
            exchange=exchange,
            headers=line.headers,
            query=urlsplit(line.path).query,
            reply=_reply_of(line, exchange),
        )
        total_bytes = raw_fp.system_len + raw_fp.tools_len + sum(raw_sizes)
        outcome, prep = flow.outcome, flow.prep
        if outcome is None or prep is None:  # bypassed or not ours: forwarded as sent
            total.add(total_bytes, 0, 0, None, None)
            continue
        rec = outcome.record
        lin = lineages.get(rec.id)
        if lin is None:
            lin = lineages[rec.id] = Lineage(rec.id, rec.kind, rec.parent)
        repaired_fork = outcome.role == "fork" and outcome.fork_action == "repaired"
        parent_lin = lineages.get(rec.parent or "") if repaired_fork else lin
        fp_after, depth = rec.fingerprint, outcome.depth
        before = after = 0
        cause_before = cause_after = None
        if outcome.parent_fp is not None and fp_after is not None:
            p = predict(fp_after, outcome.parent_fp, depth, prep.sizes)
            after, cause_after = p.shared, p.cause
            total_after = p.total
            if parent_lin is not None and parent_lin.last_raw is not None:
                q = predict(raw_fp, parent_lin.last_raw[0], depth, raw_sizes)
                before, cause_before = q.shared, q.cause
            # Ratios are per request, so scale "after" to the bytes as received.
            after = round(after / total_after * total_bytes) if total_after else 0
        lin.last_raw = (raw_fp, len(raw_sizes))
        lin.tally.add(total_bytes, before, after, cause_before, cause_after)
        total.add(total_bytes, before, after, cause_before, cause_after)
        model = line.body.get("model") if isinstance(line.body, dict) else None
        acc = by_model.setdefault(model if isinstance(model, str) else "unknown", [0, 0, 0])
        acc[0] += before
        acc[1] += after
        acc[2] += total_bytes
    kinds = Counter(lin.kind for lin in lineages.values())
    # Show lineages numbered in order of appearance.
    names = {lid: f"L{i}" for i, lid in enumerate(lineages, 1)}
    for lin in lineages.values():
        lin.id, lin.parent = names[lin.id], names.get(lin.parent or "", lin.parent)
    return {
        "requests": total.requests,
        "malformed_lines": [],
        "lineages": [
            {"id": lin.id, "kind": lin.kind, "parent": lin.parent, **lin.tally.as_dict()} for lin in lineages.values()
        ],
        "lineage_kinds": dict(kinds),
        "total": total.as_dict(),
        "savings": _savings(by_model, Pricing(config.provider_cache.price_map())),
    }


def _savings(by_model: dict[str, list[int]], pricing: Pricing) -> dict[str, Any]:
    """USD the predicted cache use saves per model, writes' extra cost subtracted
    (None: the model has no price)."""
    out: dict[str, Any] = {}
    for model, (before, after, total) in by_model.items():
        price = pricing.price(model)
        prompt = total // BYTES_PER_TOKEN
        cached = before // BYTES_PER_TOKEN, after // BYTES_PER_TOKEN
        usage = [Usage(prompt, c, prompt - c) for c in cached]
        out[model] = {
            "cached_tokens_before": usage[0].cached,
            "cached_tokens_after": usage[1].cached,
            "cache_write_tokens_before": usage[0].cache_write,
            "cache_write_tokens_after": usage[1].cache_write,
            "saved_usd_before": round(saved(price, usage[0]), 6) if price else None,
            "saved_usd_after": round(saved(price, usage[1]), 6) if price else None,
        }
    return out


def _pct(x: float) -> str:
    return f"{x * 100:5.1f}%"


def _breaks(c: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])) or "-"


def render(report: dict[str, Any], path: str) -> str:
    t = report["total"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(report["lineage_kinds"].items()))
    lines = [
        f"prefixpin audit: {path}",
        f"{report['requests']} requests, {len(report['lineages'])} lineages ({kinds or 'none'}), "
        f"{len(report['malformed_lines'])} malformed lines skipped",
        "",
        f"{'lineage':<8} {'kind':<5} {'parent':<8} {'reqs':>5} {'prompt KB':>10} {'before':>7} {'after':>7}  "
        f"breaks before -> after",
    ]
    for lin in report["lineages"]:
        lines.append(
            f"{lin['id']:<8} {lin['kind']:<5} {lin['parent'] or '-':<8} {lin['requests']:>5} "
            f"{lin['prompt_bytes'] / 1024:>10.1f} {_pct(lin['cacheable_before']):>7} "
            f"{_pct(lin['cacheable_after']):>7}  "
            f"{_breaks(lin['breaks_before'])} -> {_breaks(lin['breaks_after'])}"
        )
    lines += [
        "",
        f"{'total':<23} {t['requests']:>5} {t['prompt_bytes'] / 1024:>10.1f} {_pct(t['cacheable_before']):>7} "
        f"{_pct(t['cacheable_after']):>7}  {_breaks(t['breaks_before'])} -> {_breaks(t['breaks_after'])}",
        "",
        "before/after: predicted share of prompt bytes a prefix cache can serve (roots count as uncached),",
        "as the agent sent them and as prefixpin forwards them.",
    ]
    savings = report.get("savings") or {}
    if savings:
        lines += [
            "",
            f"saving at the model's prices (cached tokens ~ bytes / {BYTES_PER_TOKEN}; "
            "minus cache writes' extra cost): before -> after",
        ]
    for model, v in savings.items():
        if v["saved_usd_before"] is None:
            lines.append(f"  {model}: no price (add it to provider_cache.prices)")
        else:
            lines.append(
                f"  {model}: ${v['saved_usd_before']:.4f} -> ${v['saved_usd_after']:.4f} "
                f"({v['cached_tokens_before']} -> {v['cached_tokens_after']} cached tokens, "
                f"{v['cache_write_tokens_before']} -> {v['cache_write_tokens_after']} written)"
            )
    return "\n".join(lines) + "\n"


def run_audit(
    path: str, config: Config, *, as_json: bool = False, progress: bool = True, suggest_rules: bool = False
) -> int:
    try:
        lines, bad = read_trace(path, sys.stderr, "audit")
    except TraceError as exc:
        print(f"prefixpin audit: {exc}", file=sys.stderr)
        return 2
    if suggest_rules:  # the rules learning would pin, as a config document (proxy.cli.suggest)
        with Progress(len(lines), "learning", enabled=progress) as bar:
            rules, unwritten = asyncio.run(suggest.learned_rules(lines, config, bar))
        sys.stdout.write(suggest.document(rules, config, path, len(lines), unwritten))
        return 0
    with Progress(len(lines), "auditing", enabled=progress) as bar:
        report = asyncio.run(audit(lines, config, bar, sys.stderr))
    report["malformed_lines"] = bad
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report, path))
    return 0
