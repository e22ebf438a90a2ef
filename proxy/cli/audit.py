"""``prefixpin audit TRACE.jsonl``: what prefixpin would do to a recorded trace, offline.

Each request goes through the same canonicalizer and lineage logic as the proxy,
against an embedded store; nothing is sent anywhere.  Every request is compared
with its parent (:func:`canonicalize.parent_of`: the deepest recorded request
whose history it extends, whatever role it gets, so a root that replays a
recorded conversation under an edited system prompt is compared too): the
predicted cacheable prefix is computed twice, as the agent sent it (*before*) and
as prefixpin would forward it (*after*), the first divergence named by cause,
with its evidence (:mod:`canonicalize.evidence`: the changed field, the first
differing byte, the texts around it).  Requests without a parent count as fully
uncached.  A trace line may carry the upstream's reply under ``"response"`` (an
assistant message or a whole completion); it is recorded like the proxy records
real replies.  The usage the upstream reported (the line's ``"usage"``, else the
response's) is shown next to the prediction, with its uncached tokens split by
cause as ``prefixpin_uncached_tokens_total`` splits them (against the trace as
sent: what that upstream was sent).  Unknown keys are ignored; a malformed line
is reported with its number and skipped.

A trace ``prefixpin serve --trace`` recorded (:attr:`TraceLine.recorded`) is
audited as it was served: each line's body is the client's bytes, its ``tenant``
(the hashed one) keeps tenants apart as they were live (an empty one, a request
without credentials, shares nothing), its ``status`` and ``response`` are recorded
as the proxy recorded them, and its usage, which the upstream reported for what
prefixpin forwarded, is split against the request *after* canonicalization, as
``prefixpin_uncached_tokens_total`` split it live (a request prefixpin bypassed or
failed open: all ``new``, as live).

Every request is numbered by its ``index``, its line in the trace from 0, in the
text report, ``--json``, ``--html`` and the gate's messages alike.

``--json`` lists every request under ``requests`` (SPEC section 2e);
``--fail-on`` and ``--min-ratio`` gate CI (:mod:`proxy.cli.gate`); ``--html``
writes the report as one page (:mod:`proxy.cli.report_html`).  Evidence holds
prompt text: it goes to this output only, never to a log.

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
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import orjson

from canonicalize import (
    UNCACHED_CAUSES,
    Evidence,
    Fingerprint,
    Parent,
    Prediction,
    Usage,
    evidence,
    parent_of,
    parse_usage,
    places,
    predict,
    split_uncached,
)
from canonicalize.identity import PROMPT_PARAMS
from proxy.cli import gate, report_html, suggest
from proxy.cli.progress import Progress
from proxy.cli.trace import Trace, TraceError, TraceLine
from proxy.config import Config, Tenancy
from proxy.offline import Offline, Replayed
from proxy.pricing import Pricing, saved
from proxy.tenancy import tenant_of

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
            "cacheable_bytes_before": self.before,
            "cacheable_bytes_after": self.after,
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


@dataclass(frozen=True, slots=True)
class Seen:
    """A lineage's last request: what its next request (or a fork, or a root that
    replays it) is compared with."""

    index: int
    raw_fp: Fingerprint  # as received (no rule applied)
    sent: dict[str, Any]  # the body as the trace has it
    forwarded: dict[str, Any]  # the body as prefixpin forwards it


def _usage_of(line: TraceLine) -> Usage | None:
    """What the upstream reported for the line: its ``usage`` annotation (any shape the
    proxy reads, or this report's own ``{"prompt_tokens", "cached_tokens"}``), else the
    usage of its ``response``."""
    usage = line.extra.get("usage")
    if isinstance(usage, dict):
        found = parse_usage({"usage": usage})
        cached = usage.get("cached_tokens")
        if found is not None and isinstance(cached, int) and not isinstance(cached, bool) and not found.cached:
            found = Usage(found.prompt, cached, found.cache_write)
        return found
    resp = line.extra.get("response")
    return parse_usage(resp) if isinstance(resp, dict) else None


def _forwarded(flow: Replayed, body: dict[str, Any]) -> dict[str, Any]:
    if not flow.out or flow.out == flow.raw:
        return body
    parsed = orjson.loads(flow.out)
    return parsed if isinstance(parsed, dict) else body


def _tenant(line: TraceLine, policy: Tenancy) -> str:
    """The line's tenant: the one recorded with it ("" when it shared nothing), else
    what its credentials make (a trace's credentials are usually stripped: its
    anonymous lines are one user's)."""
    if line.recorded:
        tenant = line.extra.get("tenant")
        return tenant if isinstance(tenant, str) else ""
    raw = [
        (k.lower().encode("latin-1", "replace"), v.encode("utf-8", "surrogatepass")) for k, v in line.headers.items()
    ]
    return tenant_of(raw, urlsplit(line.path).query.encode("utf-8", "surrogatepass"), policy)


def _entry(index: int, role: str, total: int, rewrites: list[str]) -> dict[str, Any]:
    """A request's entry in the report, before it is judged against its parent."""
    return {
        "index": index,
        "lineage": None,
        "role": role,
        "parent": None,
        "cause": None,
        "evidence": None,
        "cause_before": None,
        "evidence_before": None,
        "prompt_bytes": total,
        "cacheable_bytes": 0,
        "cacheable_bytes_before": 0,
        "new_bytes": total,
        "new_bytes_before": total,
        "places": [],
        "places_before": [],
        "rewrites": list(rewrites),
    }


class Audit:
    """The report, made line by line: each line through the core offline
    (:mod:`proxy.offline`), judged against its parent."""

    def __init__(self, config: Config, errors: TextIO) -> None:
        self.config = config
        self.errors = errors
        self.policy = replace(config.tenancy, anonymous="shared")
        self.offline = Offline(config)
        self.params = (*self.offline.s.canon.fork.inherit_params, *PROMPT_PARAMS)
        self.lineages: dict[str, Lineage] = {}
        self.last: dict[str, Seen] = {}  # lineage id -> its last request
        self.requests: list[dict[str, Any]] = []
        self.total = Tally()
        self.by_model: dict[str, list[int]] = {}  # model -> [cacheable bytes before, after, prompt bytes]
        self.skipped: list[dict[str, Any]] = []

    async def add(self, line: TraceLine) -> None:
        """One line: replayed (its tenant found first: a line without one shares
        nothing, as the proxy's isolated tenant), then judged."""
        try:
            raw = self.offline.s.canon.measure(line.body, line.exchange)
        except TypeError as exc:  # e.g. a lone surrogate, which JSON text can carry and UTF-8 cannot
            print(f"prefixpin audit: line {line.line}: skipped: {exc}", file=self.errors)
            self.skipped.append({"line": line.line, "error": str(exc)})
            return
        flow = await self.offline.send(
            line.raw if line.recorded and line.raw is not None else line.body,
            exchange=line.exchange,
            headers=line.headers,
            query=urlsplit(line.path).query,
            reply=line.reply,
            status=_status(line),
            tenant=_tenant(line, self.policy),
        )
        total = raw[0].system_len + raw[0].tools_len + sum(raw[1])
        entry = _entry(line.index, flow.role, total, flow.rewrites)
        self.requests.append(entry)
        if flow.outcome is None or flow.prep is None:  # bypassed or not ours: forwarded as sent
            self.total.add(total, 0, 0, None, None)
            _observed(entry, _usage_of(line), None)
            return
        self._judged(line, flow, entry, raw, total)

    def _judged(
        self, line: TraceLine, flow: Replayed, entry: dict[str, Any], raw: tuple[Fingerprint, list[int]], total: int
    ) -> None:
        """``flow``'s request against its parent, into ``entry`` and the tallies."""
        outcome, prep = flow.outcome, flow.prep
        assert outcome is not None and prep is not None
        rec = outcome.record
        lin = self.lineages.get(rec.id)
        if lin is None:
            lin = self.lineages[rec.id] = Lineage(rec.id, rec.kind, rec.parent)
        entry["lineage"] = rec.id
        forwarded = _forwarded(flow, line.body)
        parent = parent_of(outcome, prep, flow.lookup)
        seen = self.last.get(parent.lineage) if parent is not None else None
        after_p, before_p = _judge(entry, flow, parent, seen, line, forwarded, raw, self.params)
        before, after = entry["cacheable_bytes_before"], entry["cacheable_bytes"]
        cause_before, cause_after = entry["cause_before"], entry["cause"]
        _observed(entry, _usage_of(line), _split_against(line, after_p, before_p))
        self.last[rec.id] = Seen(line.index, raw[0], line.body, forwarded)
        lin.tally.add(total, before, after, cause_before, cause_after)
        self.total.add(total, before, after, cause_before, cause_after)
        model = line.body.get("model") if isinstance(line.body, dict) else None
        acc = self.by_model.setdefault(model if isinstance(model, str) else "unknown", [0, 0, 0])
        acc[0] += before
        acc[1] += after
        acc[2] += total

    def report(self) -> dict[str, Any]:
        """The report (``--json``'s document), lineages numbered in order of appearance."""
        lineages = self.lineages
        kinds = Counter(lin.kind for lin in lineages.values())
        names = {lid: f"L{i}" for i, lid in enumerate(lineages, 1)}
        for lin in lineages.values():
            lin.id, lin.parent = names[lin.id], names.get(lin.parent or "", lin.parent)
        for entry in self.requests:
            entry["lineage"] = names.get(entry["lineage"] or "")
        return {
            "requests": self.requests,
            "malformed_lines": self.skipped,
            "lineages": [
                {"id": lin.id, "kind": lin.kind, "parent": lin.parent, **lin.tally.as_dict()}
                for lin in lineages.values()
            ],
            "lineage_kinds": dict(kinds),
            "total": self.total.as_dict(),
            "savings": _savings(self.by_model, Pricing(self.config.provider_cache.price_map())),
        }


async def audit(lines: Iterable[TraceLine], config: Config, progress: Progress, errors: TextIO) -> dict[str, Any]:
    """The report of ``lines`` (module docstring), read one at a time; ``progress``
    counts the file's lines up to each."""
    made = Audit(config, errors)
    for line in lines:
        progress.advance(line.line - progress.done)
        await made.add(line)
    return made.report()


def _judge(
    entry: dict[str, Any],
    flow: Replayed,
    parent: Parent | None,
    seen: Seen | None,
    line: TraceLine,
    forwarded: dict[str, Any],
    raw: tuple[Fingerprint, list[int]],
    params: tuple[str, ...],
) -> tuple[Prediction | None, Prediction | None]:
    """The request against its parent, after canonicalization and as sent: its cause,
    evidence, every differing place and cacheable bytes into ``entry``; returns both
    predictions."""
    outcome, prep = flow.outcome, flow.prep
    assert outcome is not None and prep is not None
    fp = outcome.record.fingerprint
    if parent is None or fp is None:
        return None, None
    p = predict(fp, parent.fingerprint, outcome.depth, prep.sizes)
    # Ratios are per request, so scale "after" to the bytes as received.
    scale = entry["prompt_bytes"] / p.total if p.total else 0.0
    entry.update(cause=p.cause, cacheable_bytes=round(p.shared * scale), new_bytes=round(p.new * scale))
    if seen is None:
        return p, None
    q = predict(raw[0], seen.raw_fp, outcome.depth, raw[1])
    entry.update(parent=seen.index, cause_before=q.cause, cacheable_bytes_before=q.shared, new_bytes_before=q.new)
    exchange = line.exchange
    if p.cause is not None:
        entry["evidence"] = evidence(exchange, seen.forwarded, forwarded, p.cause, params).to_json()
        entry["places"] = _json(places(exchange, seen.forwarded, forwarded, params))
    if q.cause is not None:
        entry["evidence_before"] = evidence(exchange, seen.sent, line.body, q.cause, params).to_json()
        entry["places_before"] = _json(places(exchange, seen.sent, line.body, params))
    return p, q


def _json(found: list[Evidence]) -> list[dict[str, Any]]:
    return [e.to_json() for e in found]


def _status(line: TraceLine) -> int:
    """The status the proxy recorded (a failed request's turn is recorded too); 200
    for a line that says none."""
    status = line.extra.get("status")
    return status if line.recorded and isinstance(status, int) and not isinstance(status, bool) else 200


def _split_against(line: TraceLine, after: Prediction | None, before: Prediction | None) -> Prediction | None:
    """What the line's usage is split against: what its upstream was sent.  A recorded
    line's upstream was sent what prefixpin forwarded (after); one prefixpin bypassed or
    failed open was counted all new."""
    if not line.recorded:
        return before
    return None if line.extra.get("role") in ("bypass", "fail-open") else after


def _observed(entry: dict[str, Any], usage: Usage | None, p: Prediction | None) -> None:
    """The upstream's usage recorded with the line, and its uncached tokens by cause
    (split against the trace as sent: the bodies that upstream was sent)."""
    if usage is None:
        entry["usage"] = entry["uncached"] = None
        return
    entry["usage"] = {"prompt_tokens": usage.prompt, "cached_tokens": usage.cached}
    entry["uncached"] = split_uncached(p, usage.prompt, usage.cached)


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
        f"{report['total']['requests']} requests, {len(report['lineages'])} lineages ({kinds or 'none'}), "
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
        "before/after: predicted share of prompt bytes a prefix cache can serve (requests without a parent",
        "count as uncached), as the agent sent them and as prefixpin forwards them.",
    ]
    lines += _break_lines(report["requests"])
    lines += _uncached_lines(report["requests"])
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


BREAKS_SHOWN = 20  # breaks the text report lists (--json and --html list all)


def _break_lines(requests: list[dict[str, Any]]) -> list[str]:
    """The breaks left after canonicalization: where each request's prefix broke."""
    broken = [r for r in requests if r["cause"]]
    if not broken:
        return []
    out = ["", "breaks after canonicalization (#index: lineage role, cause, changed field at byte):"]
    for r in broken[:BREAKS_SHOWN]:
        ev = r["evidence"] or {}
        where = f"{ev['field']} at byte {ev['offset']}" if ev else "-"
        more = len(r["places"]) - 1
        also = f" (+{more} more place{'s' if more != 1 else ''})" if more > 0 else ""
        out.append(f"  #{r['index']:<5} {r['lineage']} {r['role']}, {r['cause']}, {where}{also}")
    if len(broken) > BREAKS_SHOWN:
        out.append(f"  ... and {len(broken) - BREAKS_SHOWN} more (--json or --html lists them all)")
    return out


def _uncached_lines(requests: list[dict[str, Any]]) -> list[str]:
    """The upstream's uncached tokens by cause, when the trace carries usage."""
    observed = [r for r in requests if r["usage"] is not None]
    if not observed:
        return []
    prompt = sum(r["usage"]["prompt_tokens"] for r in observed)
    cached = sum(r["usage"]["cached_tokens"] for r in observed)
    by_cause: Counter[str] = Counter()
    for r in observed:
        by_cause.update(r["uncached"])
    causes = ", ".join(f"{k} {by_cause[k]}" for k in UNCACHED_CAUSES if by_cause[k]) or "-"
    return [
        "",
        f"observed ({len(observed)} requests with usage): {prompt} prompt tokens, {cached} cached;",
        f"uncached by cause: {causes}",
    ]


def run_audit(
    path: str,
    config: Config,
    *,
    as_json: bool = False,
    progress: bool = True,
    html: str | None = None,
    fail_on: str | None = None,
    min_ratio: float | None = None,
    suggest_rules: bool = False,
) -> int:
    """Exit codes: 0 done (and the gate passed), 2 usage error, 3 the gate failed."""
    try:
        checks = gate.Gate.parse(fail_on, min_ratio)
        trace = Trace(path, sys.stderr, "audit")
        if suggest_rules:  # the rules learning would pin, as a config document (proxy.cli.suggest)
            with Progress(trace.lines, "learning", enabled=progress) as bar:
                rules, unwritten, read = asyncio.run(suggest.learned_rules(trace, config, bar))
            sys.stdout.write(suggest.document(rules, config, path, read, unwritten))
            return 0
        with Progress(trace.lines, "auditing", enabled=progress) as bar:
            report = asyncio.run(audit(trace, config, bar, sys.stderr))
    except (gate.GateError, TraceError) as exc:
        print(f"prefixpin audit: {exc}", file=sys.stderr)
        return 2
    report["malformed_lines"] = sorted([*trace.skipped, *report["malformed_lines"]], key=lambda m: int(m["line"]))
    if html is not None:
        try:
            # errors="replace": a trace's JSON may hold lone surrogates, which UTF-8 cannot.
            Path(html).write_text(report_html.render(report, path), encoding="utf-8", errors="replace")
        except OSError as exc:
            print(f"prefixpin audit: cannot write {html}: {exc}", file=sys.stderr)
            return 2
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report, path))
    failures = checks.failures(report)
    if failures:
        sys.stderr.write(gate.report_failures(failures))
        return gate.FAILED
    return 0
