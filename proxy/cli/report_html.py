"""``prefixpin audit TRACE --html FILE``: the audit as one self-contained page.

One HTML file, its CSS inline, no script and no external resource (a
Content-Security-Policy of ``default-src 'none'`` says so to the browser):

- a summary: requests, lineages, the predicted cacheable share before and after
  canonicalization, the breaks left, and the observed tokens when the trace
  carries usage;
- every lineage as a tree, each fork drawn under its parent, each a ``<details>``
  that folds;
- per request (``#index``: its line in the trace, from 0, the number ``--json``
  and the gate use), two bars of its prompt bytes (as long as the prompt, against
  the trace's longest): *sent*, the trace as the agent sent it, and *after*
  canonicalization; each cacheable (the parent's bytes up to the break), broken
  (the parent's bytes after it, the break's cost) and new (what the parent never
  sent); under them, when the line carries usage, the observed tokens: cached,
  and the uncached ones by cause;
- every break (as sent, and after canonicalization) with its cause and every
  place the request differs from its parent: the changed field, the byte it
  starts at, and the two texts with the changed run marked.

A large trace (more than :data:`COMPACT_AT` requests) opens compact: only the
requests with a break are shown (a checkbox, a CSS-only toggle, shows the rest),
lineages without any break are folded, and so are the breaks prefixpin fixes.

Everything from the trace is escaped (prompt text is untrusted): a trace cannot
put markup, a script or a link into the page.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

from canonicalize.evidence import EVIDENCE_CHARS, MAX_PLACES, common_prefix

COMPACT_AT = 40  # requests past which the page opens compact (breaks only, quiet lineages folded)

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
.lane{display:flex;align-items:center;gap:6px}
.lane .lbl{flex:0 0 38px;font-size:10px;color:#7b8494;text-align:right}
.lane .track{flex:1}
.bar{display:flex;height:12px;background:#eef0f3;border-radius:2px;overflow:hidden;margin:2px 0}
.bar span{display:block;height:100%}
.bar.sent{height:8px;opacity:.8}
.bar.observed{height:7px}
.toggle{margin:14px 0 0;font-size:13px}
.toggle input{vertical-align:-2px;margin-right:6px}
#only-breaks:checked ~ #lineages tr[data-break="none"],
#only-left:checked ~ #lineages tr.request:not([data-break="left"]){display:none}
#only-breaks:checked ~ #lineages .hidden-note.quiet,#only-left:checked ~ #lineages .hidden-note.fine{display:inline}
#only-left:checked ~ #lineages .hidden-note.quiet{display:none}
.hidden-note{display:none;color:#7b8494;font-weight:400}
section.folded>details>summary{font-size:16px;font-weight:600;padding:8px 0;background:none}
section.folded>details{border:0;background:none}
ol.places{margin:4px 0 2px;padding-left:20px}
ol.places li{margin:4px 0}
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
    compact = len(requests) > COMPACT_AT
    widest = max((r["prompt_bytes"] for r in requests), default=0) or 1
    by_lineage: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for r in requests:
        by_lineage[r["lineage"]].append(r)
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for lin in report["lineages"]:
        children[lin["parent"]].append(lin)
    tree = _Tree(children, by_lineage, widest, compact)
    html = "".join(tree.lineage(lin) for lin in children[None])
    known = {lin["id"] for lin in report["lineages"]}
    for parent, orphans in children.items():  # a fork whose parent is not in the trace
        if parent is not None and parent not in known:
            html += "".join(tree.lineage(lin) for lin in orphans)
    if by_lineage.get(None):
        html += tree.group("unattributed", "requests forwarded as sent (bypassed, not JSON)", by_lineage[None])
    left = "".join(_break(r) for r in requests if r["cause"])
    fixed = "".join(_break(r) for r in requests if r["cause_before"] and not r["cause"])
    n_fixed = sum(1 for r in requests if r["cause_before"] and not r["cause"])
    body = (
        f'<header><h1>prefixpin audit</h1><p class="trace">{escape(trace)}</p></header><main>'
        f"{_summary(report)}{_legend()}"
        f'<input type="checkbox" id="only-breaks"{" checked" if compact else ""}>'
        '<label class="toggle" for="only-breaks">only the requests with a break (as sent or after)</label> '
        '<input type="checkbox" id="only-left">'
        '<label class="toggle" for="only-left">only the breaks left after canonicalization</label>'
        f'<section id="lineages"><h2>Lineages</h2><ul class="tree">{html}</ul></section>'
        f'<section id="breaks"><h2>Breaks left after canonicalization</h2>'
        f"{left or NO_BREAKS}</section>"
        f'<section id="fixed" class="folded"><details{"" if compact else " open"}><summary>'
        f"Breaks prefixpin fixes (as sent): {n_fixed}</summary>{fixed or NONE}</details></section>"
        "</main><footer>Bytes are predicted offline from the trace; tokens are what the upstream reported "
        "(when the trace has them). Requests are numbered by their line in the trace, from 0 (#0 is the "
        "first line), as in prefixpin audit --json. Generated by prefixpin audit.</footer>"
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
        "<span>Each request (#index: its line in the trace, from 0): its prompt bytes to scale, as the agent "
        "sent them (sent) and as prefixpin forwards them (after); under them, the tokens the upstream reported "
        "(cached, then uncached by cause) when the trace has them.</span>"
    )
    return f'<section class="legend">{spans}{note}</section>'


def _chip(cause: str, n: int | None = None) -> str:
    color = COLORS.get(cause, "#5b6577")
    text = escape(cause) + (f" {n}" if n is not None else "")
    return f'<span class="chip" style="background:{color}">{text}</span>'


def _broken(r: dict[str, Any]) -> str:
    """``left`` (a break after canonicalization), ``fixed`` (as sent only) or ``none``."""
    return "left" if r["cause"] else "fixed" if r["cause_before"] else "none"


class _Tree:
    """The lineage tree: each lineage a folding ``<details>``, its forks under it."""

    def __init__(
        self,
        children: dict[str | None, list[dict[str, Any]]],
        by_lineage: dict[str | None, list[dict[str, Any]]],
        widest: int,
        compact: bool,
    ) -> None:
        self.children, self.by_lineage, self.widest, self.compact = children, by_lineage, widest, compact

    def lineage(self, lin: dict[str, Any]) -> str:
        kind = "fork" if lin["kind"] == "fork" else "root"
        parent = f" of {escape(lin['parent'])}" if lin["parent"] else ""
        mine = self.by_lineage.get(lin["id"], [])
        if mine and mine[0]["parent"] is not None and not lin["parent"]:  # a root that replays a conversation
            parent = f' <a href="#req-{mine[0]["parent"]}">after #{mine[0]["parent"]}</a>'
        breaks = sum(lin["breaks_after"].values())
        n = lin["requests"]
        meta = (
            f"{n} request{'s' if n != 1 else ''} · {lin['prompt_bytes'] / 1024:.1f} KB · cacheable "
            f"{_pct(lin['cacheable_before'])} → {_pct(lin['cacheable_after'])} · "
            f"{sum(lin['breaks_before'].values())} → {breaks} breaks"
        )
        forks = "".join(self.lineage(c) for c in self.children.get(lin["id"], []))
        return (
            f'<li class="lineage {kind}" id="lineage-{escape(lin["id"])}">{self._details(mine)}<summary>'
            f'<span class="kind {kind}">{kind}{parent}</span>{escape(lin["id"])} <span class="meta">{meta}</span>'
            f"{_hidden(mine)}</summary>{self.table(mine)}</details>"
            f"{f'<ul>{forks}</ul>' if forks else ''}</li>"
        )

    def group(self, name: str, meta: str, requests: list[dict[str, Any]]) -> str:
        return (
            f'<li class="lineage other">{self._details(requests)}<summary>{escape(name)} '
            f'<span class="meta">{escape(meta)}</span>{_hidden(requests)}</summary>'
            f"{self.table(requests)}</details></li>"
        )

    def _details(self, requests: list[dict[str, Any]]) -> str:
        """Open, except a lineage without any break in a compact page."""
        quiet = all(_broken(r) == "none" for r in requests)
        return "<details>" if self.compact and quiet else "<details open>"

    def table(self, requests: list[dict[str, Any]]) -> str:
        return f'<table class="requests">{"".join(_row(r, self.widest) for r in requests)}</table>'


def _hidden(requests: list[dict[str, Any]]) -> str:
    """What the compact views leave out of a lineage, said in its summary."""
    quiet = sum(1 for r in requests if _broken(r) == "none")
    fine = sum(1 for r in requests if _broken(r) != "left")
    notes = f' <span class="hidden-note quiet">({quiet} without a break hidden)</span>' if quiet else ""
    return notes + (f' <span class="hidden-note fine">({fine} without a break left hidden)</span>' if fine else "")


def _row(r: dict[str, Any], widest: int) -> str:
    total = r["prompt_bytes"]
    width = 100 * total / widest
    sent = _bytes(total, r["cacheable_bytes_before"], r.get("new_bytes_before", total), r["cause_before"])
    after = _bytes(total, r["cacheable_bytes"], r["new_bytes"], r["cause"])
    lanes = _lane("sent", _bar(sent, total, width, _title("as sent", sent), "bytes sent"))
    lanes += _lane("after", _bar(after, total, width, _title("after canonicalization", after), "bytes"))
    usage = r.get("usage")
    if usage:
        split = r.get("uncached") or {}
        parts = [("cached", usage["cached_tokens"]), *((c, split.get(c, 0)) for c in _ORDER)]
        detail = ", ".join(f"{n:,} {c}" for c, n in parts if n)
        tokens = _bar(parts, usage["prompt_tokens"], width, f"{usage['prompt_tokens']:,} tokens: {detail}", "observed")
        lanes += _lane("tokens", tokens)
    if r["cause"]:
        state = f'<a href="#break-{r["index"]}">{_chip(r["cause"])}</a>'
    elif r["cause_before"]:
        state = f'<a class="fixed" href="#break-{r["index"]}">{escape(r["cause_before"])} fixed</a>'
    else:
        state = ""
    return (
        f'<tr class="request" data-break="{_broken(r)}" id="req-{r["index"]}"><td class="idx">#{r["index"]}</td>'
        f'<td class="role">{escape(str(r["role"]))}</td><td class="bars">{lanes}</td><td>{state}</td></tr>'
    )


def _bytes(total: int, cacheable: int, new: int, cause: str | None) -> list[tuple[str, int]]:
    """A prompt's bytes: cacheable, after the break (in the cause's colour), new."""
    broken = max(total - cacheable - new, 0)
    return [("cacheable", cacheable), (cause or "new", broken), ("new", new)]


def _title(when: str, segments: list[tuple[str, int]]) -> str:
    (_, cacheable), (_, broken), (_, new) = segments
    total = cacheable + broken + new
    return f"{when}: {total:,} bytes: {cacheable:,} cacheable, {broken:,} after the break, {new:,} new"


def _lane(label: str, bar: str) -> str:
    return f'<div class="lane"><span class="lbl">{label}</span><div class="track">{bar}</div></div>'


_ORDER = ("evicted", "system_changed", "tools_changed", "params_changed", "model_changed", "history_rewritten", "new")


def _bar(segments: list[tuple[str, int]], total: int, width: float, title: str, cls: str) -> str:
    spans = "".join(
        f'<span class="seg {escape(k)}" style="width:{100 * n / total:.3f}%;background:{COLORS.get(k, "#999")}"></span>'
        for k, n in segments
        if n > 0 and total > 0
    )
    return f'<div class="bar {cls}" style="width:{max(width, 0.5):.2f}%" title="{escape(title)}">{spans}</div>'


def _break(r: dict[str, Any]) -> str:
    parent = f" against #{r['parent']}" if r.get("parent") is not None else ""
    lineage = f" ({escape(str(r['lineage']))}, {escape(str(r['role']))})"
    parts = []
    same = (r["cause_before"], r.get("places_before")) == (r["cause"], r.get("places"))
    if r["cause"] and same:
        parts.append(_evidence("as sent and after canonicalization", r["cause"], r["evidence"], r.get("places")))
    else:
        if r["cause_before"]:
            parts.append(_evidence("as sent", r["cause_before"], r["evidence_before"], r.get("places_before")))
        if r["cause"]:
            parts.append(_evidence("after canonicalization", r["cause"], r["evidence"], r.get("places")))
        elif r["cause_before"]:
            parts.append('<p class="evidence fixed">after canonicalization: no break (prefixpin fixes it)</p>')
    color = COLORS.get(r["cause"] or "cacheable", "#999")
    return (
        f'<article class="break" id="break-{r["index"]}" style="border-left-color:{color}">'
        f'<h3><a href="#req-{r["index"]}">#{r["index"]}</a>{lineage}{parent}</h3>{"".join(parts)}</article>'
    )


def _evidence(when: str, cause: str, ev: dict[str, Any] | None, places: list[dict[str, Any]] | None) -> str:
    """The break's cause and every place the request differs from its parent (the
    break's own evidence when the report lists no places)."""
    found = places or ([ev] if ev else [])
    head = f'<p class="evidence">{escape(when)}: {_chip(cause)}'
    if not found:
        return head + "</p>"
    n = len(found)
    if n >= MAX_PLACES:
        head += f" · {n} places or more differ from the parent (the first {n} shown)</p>"
    else:
        head += f" · {n} place{'s' if n != 1 else ''} differ{'s' if n == 1 else ''} from the parent</p>"
    return head + '<ol class="places">' + "".join(f"<li>{_place(p)}</li>" for p in found) + "</ol>"


def _place(ev: dict[str, Any]) -> str:
    before, after = _marked(ev["before"], ev["after"], int(ev["offset"]))
    return (
        f'<p class="evidence"><code>{escape(ev["field"])}</code> at byte {int(ev["offset"]):,}</p>'
        f'<div class="diff before"><span class="lbl">parent</span>{before}</div>'
        f'<div class="diff after"><span class="lbl">this</span>{after}</div>'
    )


def _marked(before: str, after: str, offset: int) -> tuple[str, str]:
    """Both texts escaped, the run that differs marked (<del> in the parent's, <ins> in
    this one), an ellipsis where the evidence's window cut them."""
    k = common_prefix(before, after)
    s = common_prefix(before[k:][::-1], after[k:][::-1])
    mid_b, mid_a = before[k : len(before) - s], after[k : len(after) - s]

    # The window starts after the text does (offset: the first differing byte in this
    # request's text; the windows share what comes before it).
    cut = len(after[:k].encode("utf-8", "surrogatepass")) < offset
    lead = '<span class="cut">…</span>' if cut else ""

    def mark(text: str, mid: str, tag: str) -> str:
        inner = f"<{tag}>{escape(mid)}</{tag}>" if mid else f'<{tag} class="empty">∅</{tag}>'
        tail = '<span class="cut">…</span>' if len(text) >= EVIDENCE_CHARS else ""
        return lead + escape(text[:k]) + inner + escape(text[k + len(mid) :]) + tail

    if not before and not after:
        return '<span class="empty">(empty)</span>', '<span class="empty">(empty)</span>'
    return mark(before, mid_b, "del"), mark(after, mid_a, "ins")
