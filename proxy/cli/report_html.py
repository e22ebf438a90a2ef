"""``prefixpin audit TRACE --html FILE``: the audit as one self-contained page.

One HTML file, its CSS inline, no script and no external resource (a
Content-Security-Policy of ``default-src 'none'`` says so to the browser):

- a summary: requests, lineages, the predicted cacheable share before and after
  canonicalization, the breaks left, and the observed tokens when the trace
  carries usage;
- every lineage as a tree, each fork drawn under its parent;
- per request, a bar of its prompt bytes (as long as the prompt, against the
  trace's longest): cacheable (the parent's bytes up to the break), broken (the
  parent's bytes after it, the break's cost) and new (what the parent never
  sent); under it, when the line carries usage, the observed tokens: cached, and
  the uncached ones by cause;
- every break (as sent, and after canonicalization) with its cause, the changed
  field, the byte it starts at, and the two texts with the changed run marked.

Everything from the trace is escaped (prompt text is untrusted): a trace cannot
put markup, a script or a link into the page.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

from canonicalize.evidence import EVIDENCE_CHARS, common_prefix

COLORS = {
    "cacheable": "#2e9e5b",
    "new": "#8fa3bf",
    "system_changed": "#d9534f",
    "tools_changed": "#e8833a",
    "params_changed": "#b565c8",
    "model_changed": "#7a4fd9",
    "history_rewritten": "#c9a227",
    "evicted": "#4a4a4a",
    "cached": "#2e9e5b",
}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px}
header .trace{margin:2px 0 0;color:#b8c0cc;font-family:ui-monospace,monospace;font-size:12px}
main{padding:16px 24px}
h2{font-size:16px;margin:18px 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;min-width:150px}
.card .k{color:#5b6577;font-size:12px}.card .v{font-size:20px;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:12px 0;font-size:12px;color:#3b4556}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:4px}
ul.tree,ul.tree ul{list-style:none;margin:0;padding-left:22px}
ul.tree{padding-left:0}
ul.tree ul{border-left:2px solid #c5cbd5;margin-left:10px}
li.lineage{margin:8px 0}
details{background:#fff;border:1px solid #dde1e7;border-radius:6px}
summary{cursor:pointer;padding:8px 12px;font-weight:600}
summary .meta{font-weight:400;color:#5b6577}
.kind{display:inline-block;font-size:11px;padding:1px 6px;border-radius:8px;background:#e3e8ef;margin-right:6px}
.kind.fork{background:#fde8cf}
table.requests{border-collapse:collapse;width:100%;font-size:12px}
table.requests td{padding:3px 10px;border-top:1px solid #eef0f3;vertical-align:middle}
td.idx{font-family:ui-monospace,monospace;white-space:nowrap;color:#5b6577;width:70px}
td.role{width:90px}
td.bars{width:60%}
.bar{display:flex;height:12px;background:#eef0f3;border-radius:2px;overflow:hidden;margin:2px 0}
.bar span{display:block;height:100%}
.bar.observed{height:7px}
.chip{display:inline-block;font-size:11px;padding:1px 6px;border-radius:8px;color:#fff;margin-right:4px}
.fixed{color:#2e7d4f;font-size:11px}
article.break{border:1px solid #dde1e7;border-left:4px solid #d9534f;border-radius:4px;background:#fff;
  margin:10px 0;padding:6px 10px}
article.break h3{font-size:13px;margin:2px 0 6px}
.evidence{font-size:12px;color:#3b4556;margin:6px 0 2px}
.diff{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;word-break:break-all;
  background:#fff;border:1px solid #e3e6eb;border-radius:4px;padding:4px 6px;margin:2px 0}
.diff .lbl{display:inline-block;width:52px;color:#7b8494;user-select:none}
del{background:#f8c9c7;color:#8a1f1b;text-decoration:line-through}
ins{background:#c8ecd3;color:#15582f;text-decoration:none}
.empty{color:#7b8494;font-style:italic}
.cut{color:#9aa3b2}
#breaks article.break h3 a,#fixed article.break h3 a{color:inherit}
footer{color:#7b8494;font-size:12px;padding:12px 24px 24px}
"""
NO_BREAKS = '<p class="empty">none: every request extends its parent&#39;s prefix</p>'
NONE = '<p class="empty">none</p>'


def render(report: dict[str, Any], trace: str) -> str:
    """The page for ``report`` (``proxy.cli.audit.audit``'s) of the trace ``trace``."""
    requests = report["requests"]
    widest = max((r["prompt_bytes"] for r in requests), default=0) or 1
    by_lineage: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for r in requests:
        by_lineage[r["lineage"]].append(r)
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for lin in report["lineages"]:
        children[lin["parent"]].append(lin)
    tree = "".join(_lineage(lin, children, by_lineage, widest) for lin in children[None])
    known = {lin["id"] for lin in report["lineages"]}
    for parent, orphans in children.items():  # a fork whose parent is not in the trace
        if parent is not None and parent not in known:
            tree += "".join(_lineage(lin, children, by_lineage, widest) for lin in orphans)
    if by_lineage.get(None):
        tree += _group("unattributed", "requests forwarded as sent (bypassed, not JSON)", by_lineage[None], widest)
    left = "".join(_break(r) for r in requests if r["cause"])
    fixed = "".join(_break(r) for r in requests if r["cause_before"] and not r["cause"])
    body = (
        f'<header><h1>prefixpin audit</h1><p class="trace">{escape(trace)}</p></header><main>'
        f"{_summary(report)}{_legend()}"
        f'<section id="lineages"><h2>Lineages</h2><ul class="tree">{tree}</ul></section>'
        f'<section id="breaks"><h2>Breaks left after canonicalization</h2>'
        f"{left or NO_BREAKS}</section>"
        f'<section id="fixed"><h2>Breaks prefixpin fixes (as sent)</h2>'
        f"{fixed or NONE}</section>"
        "</main><footer>Bytes are predicted offline from the trace; tokens are what the upstream reported "
        "(when the trace has them). Generated by prefixpin audit.</footer>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>prefixpin audit: {escape(trace)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _card(key: str, value: str, cls: str = "") -> str:
    return f'<div class="card {cls}"><div class="k">{escape(key)}</div><div class="v">{value}</div></div>'


def _summary(report: dict[str, Any]) -> str:
    t = report["total"]
    kinds = report["lineage_kinds"]
    lineages = f"{len(report['lineages'])} <small>({kinds.get('root', 0)} root, {kinds.get('fork', 0)} fork)</small>"
    breaks = sum(t["breaks_after"].values())
    chips = "".join(_chip(c, n) for c, n in sorted(t["breaks_after"].items(), key=lambda kv: -kv[1]))
    cards = [
        _card("requests", str(t["requests"])),
        _card("lineages", lineages),
        _card("predicted cacheable, as sent → after", f"{_pct(t['cacheable_before'])} → {_pct(t['cacheable_after'])}"),
        _card("breaks as sent → after", f"{sum(t['breaks_before'].values())} → {breaks} {chips}"),
    ]
    observed = [r for r in report["requests"] if r.get("usage")]
    if observed:
        prompt = sum(r["usage"]["prompt_tokens"] for r in observed)
        cached = sum(r["usage"]["cached_tokens"] for r in observed)
        ratio = cached / prompt if prompt else 0.0
        cards.append(_card("observed cached / prompt tokens", f"{cached:,} / {prompt:,} ({_pct(ratio)})"))
    return f'<section id="summary" class="cards">{"".join(cards)}</section>'


def _legend() -> str:
    items = [("cacheable", "cacheable: the parent's bytes before the break")]
    items += [(c, c) for c in ("system_changed", "tools_changed", "params_changed", "model_changed")]
    items += [("history_rewritten", "history_rewritten"), ("new", "new: bytes the parent never sent")]
    items += [("evicted", "evicted (observed): the parent's bytes the upstream no longer had")]
    spans = "".join(f'<span><i class="sw" style="background:{COLORS[k]}"></i>{escape(t)}</span>' for k, t in items)
    note = (
        "<span>Each request: its prompt bytes after canonicalization, to scale; under it, thinner, the tokens "
        "the upstream reported (cached, then uncached by cause, against the trace as sent) when the trace has "
        "them.</span>"
    )
    return f'<section class="legend">{spans}{note}</section>'


def _chip(cause: str, n: int | None = None) -> str:
    color = COLORS.get(cause, "#5b6577")
    text = escape(cause) + (f" {n}" if n is not None else "")
    return f'<span class="chip" style="background:{color}">{text}</span>'


def _lineage(
    lin: dict[str, Any],
    children: dict[str | None, list[dict[str, Any]]],
    by_lineage: dict[str | None, list[dict[str, Any]]],
    widest: int,
) -> str:
    kind = "fork" if lin["kind"] == "fork" else "root"
    parent = f" of {escape(lin['parent'])}" if lin["parent"] else ""
    mine = by_lineage.get(lin["id"], [])
    if mine and mine[0]["parent"] is not None and not lin["parent"]:  # a root that replays a recorded conversation
        parent = f' <a href="#req-{mine[0]["parent"]}">after line {mine[0]["parent"] + 1}</a>'
    breaks = sum(lin["breaks_after"].values())
    n = lin["requests"]
    meta = (
        f"{n} request{'s' if n != 1 else ''} · {lin['prompt_bytes'] / 1024:.1f} KB · cacheable "
        f"{_pct(lin['cacheable_before'])} → {_pct(lin['cacheable_after'])} · "
        f"{sum(lin['breaks_before'].values())} → {breaks} breaks"
    )
    forks = "".join(_lineage(c, children, by_lineage, widest) for c in children.get(lin["id"], []))
    return (
        f'<li class="lineage {kind}" id="lineage-{escape(lin["id"])}"><details open><summary>'
        f'<span class="kind {kind}">{kind}{parent}</span>{escape(lin["id"])} <span class="meta">{meta}</span>'
        f"</summary>{_table(by_lineage.get(lin['id'], []), widest)}</details>"
        f"{f'<ul>{forks}</ul>' if forks else ''}</li>"
    )


def _group(name: str, meta: str, requests: list[dict[str, Any]], widest: int) -> str:
    return (
        f'<li class="lineage other"><details open><summary>{escape(name)} <span class="meta">{escape(meta)}</span>'
        f"</summary>{_table(requests, widest)}</details></li>"
    )


def _table(requests: list[dict[str, Any]], widest: int) -> str:
    return f'<table class="requests">{"".join(_row(r, widest) for r in requests)}</table>'


def _row(r: dict[str, Any], widest: int) -> str:
    total = r["prompt_bytes"]
    cacheable, new = r["cacheable_bytes"], r["new_bytes"]
    broken = max(total - cacheable - new, 0)
    width = 100 * total / widest
    segments = [("cacheable", cacheable), (r["cause"] or "new", broken), ("new", new)]
    title = f"{total:,} bytes: {cacheable:,} cacheable, {broken:,} after the break, {new:,} new"
    bars = _bar(segments, total, width, title, "bytes")
    usage = r.get("usage")
    if usage:
        split = r.get("uncached") or {}
        parts = [("cached", usage["cached_tokens"]), *((c, split.get(c, 0)) for c in _ORDER)]
        detail = ", ".join(f"{n:,} {c}" for c, n in parts if n)
        bars += _bar(parts, usage["prompt_tokens"], width, f"{usage['prompt_tokens']:,} tokens: {detail}", "observed")
    if r["cause"]:
        state = f'<a href="#break-{r["index"]}">{_chip(r["cause"])}</a>'
    elif r["cause_before"]:
        state = f'<a class="fixed" href="#break-{r["index"]}">{escape(r["cause_before"])} fixed</a>'
    else:
        state = ""
    return (
        f'<tr class="request" id="req-{r["index"]}"><td class="idx">line {r["index"] + 1}</td>'
        f'<td class="role">{escape(str(r["role"]))}</td><td class="bars">{bars}</td><td>{state}</td></tr>'
    )


_ORDER = ("evicted", "system_changed", "tools_changed", "params_changed", "model_changed", "history_rewritten", "new")


def _bar(segments: list[tuple[str, int]], total: int, width: float, title: str, cls: str) -> str:
    spans = "".join(
        f'<span class="seg {escape(k)}" style="width:{100 * n / total:.3f}%;background:{COLORS.get(k, "#999")}"></span>'
        for k, n in segments
        if n > 0 and total > 0
    )
    return f'<div class="bar {cls}" style="width:{max(width, 0.5):.2f}%" title="{escape(title)}">{spans}</div>'


def _break(r: dict[str, Any]) -> str:
    parent = f" against line {r['parent'] + 1}" if r.get("parent") is not None else ""
    lineage = f" ({escape(str(r['lineage']))}, {escape(str(r['role']))})"
    parts = []
    if r["cause"] and (r["cause_before"], r["evidence_before"]) == (r["cause"], r["evidence"]):
        parts.append(_evidence("as sent and after canonicalization", r["cause"], r["evidence"]))
    else:
        if r["cause_before"]:
            parts.append(_evidence("as sent", r["cause_before"], r["evidence_before"]))
        if r["cause"]:
            parts.append(_evidence("after canonicalization", r["cause"], r["evidence"]))
        elif r["cause_before"]:
            parts.append('<p class="evidence fixed">after canonicalization: no break (prefixpin fixes it)</p>')
    color = COLORS.get(r["cause"] or "cacheable", "#999")
    return (
        f'<article class="break" id="break-{r["index"]}" style="border-left-color:{color}">'
        f'<h3><a href="#req-{r["index"]}">line {r["index"] + 1}</a>{lineage}{parent}</h3>{"".join(parts)}</article>'
    )


def _evidence(when: str, cause: str, ev: dict[str, Any] | None) -> str:
    head = f'<p class="evidence">{escape(when)}: {_chip(cause)}'
    if not ev:
        return head + "</p>"
    head += f" in <code>{escape(ev['field'])}</code> at byte {int(ev['offset']):,}</p>"
    before, after = _marked(ev["before"], ev["after"], int(ev["offset"]))
    return (
        head
        + f'<div class="diff before"><span class="lbl">parent</span>{before}</div>'
        + f'<div class="diff after"><span class="lbl">this</span>{after}</div>'
    )


def _marked(before: str, after: str, offset: int) -> tuple[str, str]:
    """Both texts escaped, the run that differs marked (<del> in the parent's, <ins> in
    this one), an ellipsis where the evidence's window cut them."""
    k = common_prefix(before, after)
    s = common_prefix(before[k:][::-1], after[k:][::-1])
    mid_b, mid_a = before[k : len(before) - s], after[k : len(after) - s]

    cut = len(before[:k].encode("utf-8", "surrogatepass")) < offset  # the window starts after the text does
    lead = '<span class="cut">…</span>' if cut else ""

    def mark(text: str, mid: str, tag: str) -> str:
        inner = f"<{tag}>{escape(mid)}</{tag}>" if mid else f'<{tag} class="empty">∅</{tag}>'
        tail = '<span class="cut">…</span>' if len(text) >= EVIDENCE_CHARS else ""
        return lead + escape(text[:k]) + inner + escape(text[k + len(mid) :]) + tail

    if not before and not after:
        return '<span class="empty">(empty)</span>', '<span class="empty">(empty)</span>'
    return mark(before, mid_b, "del"), mark(after, mid_a, "ins")
