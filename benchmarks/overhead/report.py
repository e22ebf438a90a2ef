"""The run as markdown: one table per run with every workload, the generator check,
the same-run comparison with ``--compare-ref``, each round, and the roles.

Every figure is a median over rounds (:func:`benchmarks.overhead.rounds.medians`).
A *share of nginx* is the median over rounds of the target's req/s divided by
nginx's in the same round; *added p50* is the target's p50 at one connection
minus direct's.  The table has the shape of the one in docs/bench-overhead.md, so
new figures are pasted there as they are.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.overhead.roles import share

Run = dict[str, Any]


def _index(runs: list[Run]) -> dict[tuple[str, str], Run]:
    return {(r["target"], r["phase"]): r for r in runs if "latency_ms" in r}


def ratio(a: Run | None, b: Run | None) -> float | None:
    """``a``'s req/s over ``b``'s: the median of the per-round ratios when both have
    the same rounds (the targets took turns in each), else the ratio of the medians."""
    if a is None or b is None or not b["rps"]:
        return None
    ra, rb = a.get("rounds"), b.get("rounds")
    if ra and rb and len(ra) == len(rb) and all(x["rps"] for x in rb):
        return float(statistics.median(x["rps"] / y["rps"] for x, y in zip(ra, rb, strict=True)))
    return float(a["rps"] / b["rps"])


def generator_check(runs: list[Run], workloads: list[str], conns: int) -> list[tuple[str, str, bool | None]]:
    """(workload, what was measured, did wrk + upstream out-run nginx?) per workload."""
    idx = _index(runs)
    out: list[tuple[str, str, bool | None]] = []
    for w in workloads:
        d, n = idx.get(("direct", f"{w}-c{conns}")), idx.get(("nginx", f"{w}-c{conns}"))
        if d is None or n is None:
            out.append((w, "not measured (direct and nginx are both needed)", None))
            continue
        x = ratio(d, n) or 0.0
        out.append((w, f"direct {d['rps']:,.0f} req/s, nginx {n['rps']:,.0f} req/s ({x:.2f}x)", x > 1.0))
    return out


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _get(r: Run | None, *path: str) -> float | None:
    """``r[path[0]][path[1]]...``, or None for a run that is not there."""
    value: Any = r
    for key in path:
        if value is None:
            return None
        value = value[key]
    return None if value is None else float(value)


def table(doc: dict[str, Any]) -> str:
    runs, cfg = doc["runs"], doc["config"]
    idx = _index(runs)
    sat = [c for c in cfg["conns"] if c > 1]
    one = 1 in cfg["conns"]
    head = ["workload", "target"]
    for c in sat:
        head += [f"req/s, {c} conns", "share of nginx"]
    if one:
        head += ["p50 ms, 1 conn", "added p50 ms", "p99 ms, 1 conn"]
    head += ["CPU ms/req", "errors"]
    rows = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    reasons = {n: t["reason"] for n, t in doc["targets"].items() if t.get("reason")}
    for w in cfg["workloads"]:
        for name in doc["targets"]:
            if name in reasons:
                rows.append(f"| {w} | {name} | unavailable: {reasons[name]} |" + " |" * (len(head) - 3))
                continue
            cells = [w, name]
            for c in sat:
                r, n = idx.get((name, f"{w}-c{c}")), idx.get(("nginx", f"{w}-c{c}"))
                cells += [_f(_get(r, "rps"), ",.0f"), "-" if name == "direct" else _f(ratio(r, n), ".3f")]
            if one:
                r, d = idx.get((name, f"{w}-c1")), idx.get(("direct", f"{w}-c1"))
                p50, d50 = _get(r, "latency_ms", "p50"), _get(d, "latency_ms", "p50")
                added = None if p50 is None or d50 is None or name == "direct" else p50 - d50
                cells += [_f(p50, ".3f"), _f(added, "+.3f"), _f(_get(r, "latency_ms", "p99"), ".3f")]
            top = idx.get((name, f"{w}-c{max(cfg['conns'])}"))
            cells.append(_f(_get(top, "cpu_ms_per_req"), ".3f"))
            errors = sum(r["errors"] for r in runs if r["target"] == name and r["phase"].startswith(f"{w}-c"))
            cells.append(str(errors))
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def compare(doc: dict[str, Any], target: str = "prefixpin", against: str | None = None) -> list[str]:
    """``target`` over ``against`` (default: this tree over prefixpin@REF), same rounds:
    req/s at each connection count."""
    ref = doc["config"].get("compare_ref")
    against = against or (f"prefixpin@{ref}" if ref else None)
    if against is None:
        return []
    idx, out = _index(doc["runs"]), []
    for w in doc["config"]["workloads"]:
        parts = []
        for c in doc["config"]["conns"]:
            a, b = idx.get((target, f"{w}-c{c}")), idx.get((against, f"{w}-c{c}"))
            x = ratio(a, b)
            if x is not None:
                parts.append(f"{x:.3f}x req/s at {c} conn{'s' if c > 1 else ''}")
            cpu_a, cpu_b = _get(a, "cpu_ms_per_req"), _get(b, "cpu_ms_per_req")
            if c == max(doc["config"]["conns"]) and cpu_a and cpu_b:
                parts.append(f"{cpu_a / cpu_b:.3f}x CPU per request")
        if parts:
            out.append(f"- {w}: " + ", ".join(parts))
    return out


def cpu(doc: dict[str, Any]) -> list[str]:
    """CPU per request of each target next to nginx's at the top connection count: a ratio a
    busy machine moves less than req/s (it counts the target's own work, not its share of the cores)."""
    idx, top, out = _index(doc["runs"]), max(doc["config"]["conns"]), []
    for w in doc["config"]["workloads"]:
        n = idx.get(("nginx", f"{w}-c{top}"))
        if n is None or not n["cpu_ms_per_req"]:
            continue
        parts = [f"nginx {n['cpu_ms_per_req']:.3f} ms"]
        for name in doc["targets"]:
            r = idx.get((name, f"{w}-c{top}"))
            if r is not None and name not in ("nginx", "direct"):
                parts.append(f"{name} {r['cpu_ms_per_req']:.3f} ms ({r['cpu_ms_per_req'] / n['cpu_ms_per_req']:.1f}x)")
        out.append(f"- {w}: " + ", ".join(parts))
    return out


def rounds(doc: dict[str, Any]) -> list[str]:
    """Each round's req/s at saturation, per workload and target: the spread behind a median."""
    top = max(doc["config"]["conns"])
    out = []
    for r in doc["runs"]:
        if r["phase"].endswith(f"-c{top}") and r.get("rounds"):
            each = ", ".join(f"{x['rps']:,.0f}" for x in r["rounds"])
            out.append(f"- {r['phase']} {r['target']}: {each}")
    return out


def render(doc: dict[str, Any]) -> str:
    cfg, m = doc["config"], doc["machine"]
    top = max(cfg["conns"])
    out = [
        f"prefixpin overhead benchmark — {doc['date']}",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, {m['python']}, {m['nginx']}, "
        f"{m['wrk']}; prefixpin at {m['revision']}; load average {m['loadavg_start']} at start, "
        f"{m['loadavg_end']} at end.",
        f"Command: {doc['command']}",
        f"Upstream: {doc['upstream']}. Load: wrk -t1, {cfg['duration_s']} s per run after "
        f"{cfg['warmup_s']} s of warm-up, medians of {cfg['repeat']} round(s), the targets taking turns in each "
        "(in reverse order every other round)"
        + (
            f"; a run during which other processes used over {cfg['max_other']:g} cores was measured again."
            if cfg.get("max_other") is not None
            else "."
        )
        + (
            f" Every benchmark process ran with scheduling weight nice {cfg['priority']} (--priority)."
            if cfg.get("priority") is not None
            else ""
        ),
        "",
        "Workloads:",
    ]
    for w in doc["workloads"].values():
        lo, mean, hi = w["bytes"]
        out.append(f"- {w['name']}: {w['about']}; {lo / 1024:.0f}-{hi / 1024:.0f} KB, mean {mean / 1024:.0f} KB")
    out += ["", f"Generator check: wrk straight to the upstream must out-run nginx in front of it ({top} conns):"]
    for w, measured, ok in doc["generator_check"]:
        mark = {True: "ok", False: "WARNING: the generator or upstream caps nginx", None: "not checked"}[ok]
        out.append(f"- {w}: {measured} — {mark}")
    out += ["", table(doc)]
    if doc["config"].get("compare_ref"):
        out += ["", f"This tree over prefixpin@{doc['config']['compare_ref']}, same rounds:", *compare(doc)]
    if "prefixpin-trace" in doc["targets"] and "prefixpin" in doc["targets"]:
        rec = doc.get("recorded") or {}
        out += [
            "",
            f"Recording every request (trace.path; {rec.get('lines', 0):,} lines in the last "
            f"{rec.get('files', 0)} file(s)) over prefixpin, same rounds:",
            *compare(doc, "prefixpin-trace", "prefixpin"),
        ]
    out += ["", f"CPU per request at {top} connections, against nginx's:", *cpu(doc)]
    out += ["", f"Each round's req/s at {top} connections:", *rounds(doc)]
    seen = [r for r in doc["runs"] if r.get("roles")]
    if seen:
        out += ["", "Roles prefixpin gave the measured requests (from its /metrics):"]
        out += [f"- {r['phase']} {r['target']}: {share(r['roles'])}" for r in seen]
    if doc.get("role_sample"):
        out += ["", "Role sample (x-prefixpin-role of the first requests, sent one at a time in wrk's order):"]
        out += [f"- {key}: {share(counts)}" for key, counts in doc["role_sample"].items()]
    busy = max((r.get("other_cores", 0) for r in doc["runs"] if "latency_ms" in r), default=0.0)
    out += [
        "",
        f"CPU ms/req: the target's own processes at {top} connections (direct: the upstream). "
        f"Other load: processes outside the benchmark used up to {busy:.2f} cores during a run.",
    ]
    return "\n".join(out)


__all__ = ["compare", "cpu", "generator_check", "ratio", "render", "table"]
