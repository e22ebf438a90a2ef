"""Turning the runs into markdown tables and a verdict on the issue's targets.

Targets (from the issue): at 500 req/s prefixpin adds < 1 ms at p50 and < 5 ms
at p99 over direct; its cost is >= 3x less than LiteLLM's and within 5x of
nginx's.  "Added" is the target's percentile minus direct's at the same rate,
measured seconds apart; the verdict says which figures each claim rests on.
"""

from __future__ import annotations

from typing import Any

Run = dict[str, Any]


def _index(runs: list[Run]) -> dict[tuple[str, str], Run]:
    return {(r["target"], r["phase"]): r for r in runs}


def _ms(v: float | None, sign: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.2f}" if sign else f"{v:.2f}"


def added(runs: list[Run], target: str, phase: str, pct: str) -> float | None:
    idx = _index(runs)
    t, d = idx.get((target, phase)), idx.get(("direct", phase))
    if not t or not d or "latency_ms" not in t or "latency_ms" not in d or not t["ok"]:
        return None
    return round(t["latency_ms"][pct] - d["latency_ms"][pct], 3)


def open_table(runs: list[Run], targets: list[str], phases: list[str], reasons: dict[str, str]) -> str:
    idx = _index(runs)
    rows = [
        "| rate (req/s) | target | p50 ms | p99 ms | added p50 | added p99 | errors | achieved req/s | CPU ms/req "
        "| other load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in phases:
        rate = phase.rsplit("-", 1)[1]
        for name in targets:
            if name in reasons:
                rows.append(f"| {rate} | {name} | unavailable: {reasons[name]} | | | | | | | |")
                continue
            r = idx.get((name, phase))
            if r is None:
                continue
            if "unavailable" in r:
                rows.append(f"| {rate} | {name} | unavailable: {r['unavailable']} | | | | | | | |")
                continue
            lat = r["latency_ms"]
            is_direct = name == "direct"
            rows.append(
                f"| {rate} | {name} | {_ms(lat['p50'])} | {_ms(lat['p99'])} | "
                f"{'-' if is_direct else _ms(added(runs, name, phase, 'p50'), True)} | "
                f"{'-' if is_direct else _ms(added(runs, name, phase, 'p99'), True)} | "
                f"{_errors(r)} | {r['achieved_rps']:.0f} | {_cpu(r)} | {r.get('other_cores', 0):.2f} |"
            )
    return "\n".join(rows)


def _cpu(r: Run | None) -> str:
    """The target's CPU per request; meaningless for an overloaded run (work goes on after it)."""
    if r is None:
        return "-"
    return f"{r['cpu_ms_per_req']:.2f}" if _ok(r) else "overloaded"


def _errors(r: Run) -> str:
    if not r["errors"]:
        return "0"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["error_kinds"].items()))
    return f"{r['errors']} ({100 * r['errors'] / max(r['sent'], 1):.0f}%: {kinds})"


def saturation_table(runs: list[Run], targets: list[str], conns: int, reasons: dict[str, str]) -> str:
    idx = _index(runs)
    rows = [
        "| target | non-stream req/s | stream req/s | p50 ms (non-stream / stream) | CPU ms/req (non-stream / stream) "
        "| errors | other load |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in targets:
        if name in reasons:
            rows.append(f"| {name} | unavailable: {reasons[name]} | | | | | |")
            continue
        p, s = (
            r if r is not None and "latency_ms" in r else None
            for r in (idx.get((name, f"closed-plain-{conns}")), idx.get((name, f"closed-stream-{conns}")))
        )
        if p is None and s is None:
            continue

        def cell(r: Run | None, key: str) -> str:
            if r is None:
                return "-"
            if key == "rps":
                return f"{r['achieved_rps']:,.0f}"
            if key == "p50":
                return _ms(r["latency_ms"]["p50"])
            return _cpu(r)

        errs = sum(r["errors"] for r in (p, s) if r is not None)
        other = max(r.get("other_cores", 0) for r in (p, s) if r is not None)
        rows.append(
            f"| {name} | {cell(p, 'rps')} | {cell(s, 'rps')} | {cell(p, 'p50')} / {cell(s, 'p50')} | "
            f"{cell(p, 'cpu')} / {cell(s, 'cpu')} | {errs} | {other:.2f} |"
        )
    return "\n".join(rows)


def _ok(r: Run | None) -> bool:
    return r is not None and "latency_ms" in r and r["errors"] <= 0.01 * max(r["sent"], 1)


def verdict(runs: list[Run], rates: list[float], conns: int) -> list[tuple[str, str, bool | None]]:
    """(claim, what was measured, met?) for each target of the issue; None: could not be judged."""
    idx = _index(runs)
    out: list[tuple[str, str, bool | None]] = []
    if not any(r["target"] == "prefixpin" and "latency_ms" in r for r in runs):
        return [("the issue's targets", "prefixpin not measured", None)]
    top = max(rates) if rates else None
    phase = f"open-plain-{top:g}" if top else ""
    pp = idx.get(("prefixpin", phase))
    a50, a99 = added(runs, "prefixpin", phase, "p50"), added(runs, "prefixpin", phase, "p99")
    ok = _ok(pp)
    out.append(
        (
            f"prefixpin adds < 1 ms p50 at {top:g} req/s",
            f"{_ms(a50, True)} ms" + ("" if ok else " (with errors)"),
            None if a50 is None else (a50 < 1.0 and ok),
        )
    )
    out.append(
        (
            f"prefixpin adds < 5 ms p99 at {top:g} req/s",
            f"{_ms(a99, True)} ms" + ("" if ok else " (with errors)"),
            None if a99 is None else (a99 < 5.0 and ok),
        )
    )

    # vs LiteLLM: added p50 at the highest rate LiteLLM still serves (<= 1% errors), and saturation.
    served = [r for r in sorted(rates) if _ok(idx.get(("litellm", f"open-plain-{r:g}")))]
    if not any(r["target"] == "litellm" and "latency_ms" in r for r in runs):
        out.append(("prefixpin's cost >= 3x less than LiteLLM's", "LiteLLM not measured", None))
    else:
        parts, met = [], True
        if served:
            r = served[-1]
            p = added(runs, "prefixpin", f"open-plain-{r:g}", "p50")
            lt = added(runs, "litellm", f"open-plain-{r:g}", "p50")
            if p is not None and lt is not None:
                ratio = lt / p if p > 0 else float("inf")
                parts.append(f"added p50 at {r:g} req/s: LiteLLM {lt:+.2f} ms vs prefixpin {p:+.2f} ms ({ratio:.1f}x)")
                met = met and ratio >= 3
        over = [r for r in rates if r not in served]
        if over:
            parts.append(f"LiteLLM fails > 1% of requests at {', '.join(f'{r:g}' for r in over)} req/s")
        sp, sl = idx.get(("prefixpin", f"closed-plain-{conns}")), idx.get(("litellm", f"closed-plain-{conns}"))
        if sp and sl and sl["achieved_rps"]:
            ratio = sp["achieved_rps"] / sl["achieved_rps"]
            parts.append(f"saturation {sp['achieved_rps']:,.0f} vs {sl['achieved_rps']:,.0f} req/s ({ratio:.1f}x)")
            met = met and ratio >= 3
        out.append(("prefixpin's cost >= 3x less than LiteLLM's", "; ".join(parts) or "-", met if parts else None))

    # vs nginx: added p50 at the top rate, and where prefixpin still keeps up; CPU per request; saturation.
    n50 = added(runs, "nginx", phase, "p50")
    if n50 is None:
        out.append(("prefixpin within 5x of nginx", "nginx not measured", None))
    else:
        parts, met = [], True
        if a50 is not None:
            floor = max(n50, 0.05)  # nginx's added p50 is within the noise; never divide by ~0
            parts.append(
                f"added p50 at {top:g} req/s: prefixpin {a50:+.2f} ms vs nginx {n50:+.2f} ms "
                f"({a50 / floor:.1f}x, nginx floored at 0.05 ms)"
            )
            met = met and a50 <= 5 * floor and ok
        kept = [r for r in sorted(rates) if _ok(idx.get(("prefixpin", f"open-plain-{r:g}")))]
        if kept and kept[-1] != top:
            ph = f"open-plain-{kept[-1]:g}"
            p50, x50 = added(runs, "prefixpin", ph, "p50"), added(runs, "nginx", ph, "p50")
            if p50 is not None and x50 is not None:
                parts.append(
                    f"at {kept[-1]:g} req/s (the highest rate prefixpin keeps up with): {p50:+.2f} vs "
                    f"{x50:+.2f} ms ({p50 / max(x50, 0.05):.1f}x)"
                )
        ph = f"open-plain-{kept[-1]:g}" if kept else phase
        pc, nc = idx.get(("prefixpin", ph)), idx.get(("nginx", ph))
        if pc is not None and nc is not None and _ok(pc) and _ok(nc) and nc["cpu_ms_per_req"] > 0:
            pcpu, ncpu = pc["cpu_ms_per_req"], nc["cpu_ms_per_req"]
            at = ph.rsplit("-", 1)[1]
            parts.append(f"CPU/request at {at} req/s {pcpu:.2f} vs {ncpu:.2f} ms ({pcpu / ncpu:.1f}x)")
        sp, sn = idx.get(("prefixpin", f"closed-plain-{conns}")), idx.get(("nginx", f"closed-plain-{conns}"))
        if sp and sn and sp["achieved_rps"]:
            ratio = sn["achieved_rps"] / sp["achieved_rps"]
            parts.append(f"saturation {sn['achieved_rps']:,.0f} vs {sp['achieved_rps']:,.0f} req/s ({ratio:.1f}x)")
            met = met and ratio <= 5
        out.append(("prefixpin within 5x of nginx (added p50 and saturation)", "; ".join(parts), met))
    return out + issue15(runs, conns)


def issue15(runs: list[Run], conns: int) -> list[tuple[str, str, bool | None]]:
    """Issue #15 (overhead): added p50 at one connection <= 1.0 ms over direct (closed
    loop, non-streamed), and saturation >= 0.25x nginx's, same run."""
    idx = _index(runs)
    out: list[tuple[str, str, bool | None]] = []
    one = added(runs, "prefixpin", "closed-plain-1", "p50")
    out.append(
        (
            "#15: prefixpin adds <= 1.0 ms p50 at one connection",
            "not measured (--conns without 1)" if one is None else f"{one:+.2f} ms",
            None if one is None else one <= 1.0 and _ok(idx.get(("prefixpin", "closed-plain-1"))),
        )
    )
    sp, sn = idx.get(("prefixpin", f"closed-plain-{conns}")), idx.get(("nginx", f"closed-plain-{conns}"))
    if sp and sn and sn.get("achieved_rps") and conns > 1:
        ratio = sp["achieved_rps"] / sn["achieved_rps"]
        out.append(
            (
                "#15: prefixpin saturates at >= 0.25x nginx's req/s",
                f"{sp['achieved_rps']:,.0f} vs {sn['achieved_rps']:,.0f} req/s at {conns} connections ({ratio:.2f}x)",
                ratio >= 0.25 and _ok(sp),
            )
        )
    else:
        out.append(("#15: prefixpin saturates at >= 0.25x nginx's req/s", "not measured", None))
    return out


def render(doc: dict[str, Any]) -> str:
    runs, cfg = doc["runs"], doc["config"]
    reasons = {n: t["reason"] for n, t in doc["targets"].items() if t.get("reason")}
    names = list(doc["targets"])
    out = [f"prefixpin overhead benchmark — {doc['date']}", "", _machine(doc["machine"]), ""]
    out.append(
        f"Body {doc['body_bytes'][0] / 1024:.0f}-{doc['body_bytes'][1] / 1024:.0f} KB hermes-style; "
        f"{cfg['duration_s']:g} s per run after {cfg['warmup_s']:g} s warm-up; timeout {cfg['timeout_s']:g} s. "
        "Latency from each request's scheduled send to its last byte; added = target minus direct."
        + (
            f" Each row: the medians of {cfg['repeat']} rounds, the targets taking turns in each."
            if cfg.get("repeat", 1) > 1
            else ""
        )
    )
    for stream in (False, True):
        kind = "stream" if stream else "plain"
        phases = [p for p in cfg["phases"] if p.startswith(f"open-{kind}-")]
        if phases:
            out += ["", f"Open loop, {'streamed' if stream else 'non-streamed'}:", ""]
            out.append(open_table(runs, names, phases, reasons))
    for conns in cfg.get("closed_conns") or ([cfg["conns"]] if cfg["conns"] else []):
        title = "Saturation (closed loop" if conns == cfg["conns"] else "Closed loop"
        out += ["", f"{title}, {conns} connection{'s' if conns > 1 else ''}, {cfg['duration_s']:g} s):", ""]
        out.append(saturation_table(runs, names, conns, reasons))
    own = [r for r in runs if "own_overhead_ms" in r]
    if own:
        phases = list(dict.fromkeys(r["phase"] for r in own))
        cell = {(r["target"], r["phase"]): f"{r['own_overhead_ms']:.2f}" for r in own}
        out += ["", "prefixpin's own view: mean prefixpin_overhead_seconds (body read to request ready), ms:", ""]
        out.append("| target | " + " | ".join(phases) + " |")
        out.append("|---|" + "---:|" * len(phases))
        for name in dict.fromkeys(r["target"] for r in own):
            out.append(f"| {name} | " + " | ".join(cell.get((name, p), "-") for p in phases) + " |")
    out += [
        "",
        "other load: CPU cores used by processes outside the benchmark during the run (a shared "
        "machine); CPU ms/req: the target's own processes only.",
    ]
    if doc.get("verdict"):
        out += ["", "Targets from the issue:", ""]
        for claim, measured, met in doc["verdict"]:
            mark = {True: "met", False: "MISSED", None: "not judged"}[met]
            out.append(f"- {claim}: {mark} — {measured}")
    return "\n".join(out)


def _machine(m: dict[str, Any]) -> str:
    return (
        f"Machine: {m['nproc']} cores ({m['cpu']}), {m['python']}, {m['go']}, {m['nginx']}, "
        f"LiteLLM {m['litellm']}; prefixpin at {m.get('revision', '?')}; "
        f"load average {m['loadavg_start']} at start, {m['loadavg_end']} at end."
    )
