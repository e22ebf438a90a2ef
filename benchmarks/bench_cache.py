"""Cache benchmark: a pre-fix hermes trace, direct vs through prefixpin, vs its ideal twin.

One run replays three times, each against a *fresh* llama-server (its KV cache
carries over between requests, so every run starts cold and equal):

1. ``prefix-direct``: the pre-fix trace straight to llama-server;
2. ``prefix-via-prefixpin``: the same trace through a fresh ``prefixpin serve``
   (empty store) in front of llama-server;
3. ``ideal-direct``: the ideal trace (what a fixed agent sends) straight to it.

Each replay is the real CLI (``prefixpin replay --json``).  The report gives the
cached/prompt ratio overall and for fork requests only, the processed (prefilled)
tokens and the wall time of each run, prefixpin relative to the ideal, and, for
the prefixpin run, every request whose ``x-prefixpin-role`` is not the one its
trace annotation implies (root -> root, turn -> continuation, fork -> fork).

Targets: through prefixpin >= 98% of the ideal's cached ratio, forks >= 95% cached.
Exit code 1 when a target is missed or a request failed.

    python -m benchmarks.bench_cache            # 4 sessions x 6 turns, fork every 3rd
    python -m benchmarks.bench_cache --smoke    # 1 session, 4 turns, one fork (CI)
    python -m benchmarks.bench_cache --json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.traces import SMOKE, TraceSpec, work_dirs, write_pair
from tests.infra.procs import REPO, Proc, prefixpin_argv, start_llama, start_prefixpin

_PORT = re.compile(r"127\.0\.0\.1:\d+")
TARGET_VS_IDEAL = 0.98
TARGET_FORKS = 0.95
EXPECTED_ROLE = {"root": "root", "turn": "continuation", "fork": "fork"}
PER_REQUEST_KEYS = (
    "line",
    "kind",
    "session",
    "role",
    "status",
    "prompt",
    "cached",
    "processed",
    "wall_s",
    "retried",
    "error",
)
LLAMA_METRICS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total")
LLAMA = {"layers": 4, "embd": 256, "ctx": 16384, "parallel": 1}


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    trace: str  # "prefix" | "ideal"
    via_prefixpin: bool


RUNS = (
    Run("prefix-direct", "prefix", False),
    Run("prefix-via-prefixpin", "prefix", True),
    Run("ideal-direct", "ideal", False),
)


def _metric_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each Prometheus metric (all label sets) named in ``names``."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name in out:
            out[name] += float(value)
    return out


def _labelled(text: str, name: str) -> dict[str, float]:
    """One Prometheus counter by its label set (e.g. ``{action="repaired"}``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


def _get(url: str) -> str:
    return httpx.get(url, timeout=10, trust_env=False).text


def replay(trace: Path, upstream: str, via: str | None) -> dict[str, Any]:
    argv = [*prefixpin_argv(), "replay", str(trace), "--upstream", upstream, "--json", "--no-progress"]
    if via:
        argv += ["--via", via]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if proc.stderr.strip():
        print(proc.stderr.strip(), file=sys.stderr)
    if not proc.stdout.strip():
        raise RuntimeError(f"replay produced no report (exit {proc.returncode})")
    report: dict[str, Any] = json.loads(proc.stdout)
    report["exit_code"] = proc.returncode
    return report


def run_once(run: Run, trace: Path, log_dir: Path) -> dict[str, Any]:
    """Fresh llama-server (and prefixpin), one replay, the numbers."""
    procs: list[Proc] = []
    try:
        llama, llama_base = start_llama(log_dir, name=f"llama-{run.name}", **LLAMA)
        procs.append(llama)
        via = None
        if run.via_prefixpin:
            pp, via = start_prefixpin(log_dir, upstream=llama_base, name=f"prefixpin-{run.name}")
            procs.append(pp)
        started = time.perf_counter()
        report = replay(trace, llama_base, via)
        elapsed = time.perf_counter() - started
        llama_metrics = _metric_sums(_get(llama_base + "/metrics"), LLAMA_METRICS)
        extra: dict[str, Any] = {}
        if via:
            text = _get(via + "/metrics")
            extra = {
                "forks_total": _labelled(text, "prefixpin_forks_total"),
                "requests_total": _labelled(text, "prefixpin_requests_total"),
                "prefix_breaks_total": _labelled(text, "prefixpin_prefix_breaks_total"),
                "fail_open_total": _labelled(text, "prefixpin_fail_open_total"),
            }
    finally:
        for proc in reversed(procs):
            proc.stop()
    return summarize(run, report, elapsed, llama_metrics, extra)


def _ratio(t: dict[str, Any] | None) -> float | None:
    if not t or not t.get("prompt_tokens"):
        return None
    return float(t["cached_tokens"]) / float(t["prompt_tokens"])


def summarize(
    run: Run, report: dict[str, Any], elapsed: float, llama_metrics: dict[str, float], extra: dict[str, Any]
) -> dict[str, Any]:
    total = report["total"]
    forks = report["by_kind"].get("fork")
    reqs = report["requests"]
    mismatches = [
        {k: r[k] for k in ("line", "kind", "session", "role", "prompt", "cached")}
        for r in reqs
        if run.via_prefixpin and r["kind"] in EXPECTED_ROLE and r["role"] != EXPECTED_ROLE[r["kind"]]
    ]
    return {
        "run": run.name,
        "requests": total["requests"],
        "failed": total["failed"],
        "retried": total["retried"],
        "prompt_tokens": total["prompt_tokens"],
        "cached_tokens": total["cached_tokens"],
        "processed_tokens": total["processed_tokens"],
        "cached_ratio": _ratio(total),
        "fork_requests": forks["requests"] if forks else 0,
        "fork_prompt_tokens": forks["prompt_tokens"] if forks else 0,
        "fork_cached_tokens": forks["cached_tokens"] if forks else 0,
        "fork_cached_ratio": _ratio(forks),
        "request_wall_s": total["wall_s"],
        "run_wall_s": round(elapsed, 3),
        "llama_processed_tokens": llama_metrics.get("llamacpp:prompt_tokens_total"),
        "llama_cached_tokens": llama_metrics.get("llamacpp:prompt_tokens_cached_total"),
        "llama_prompt_s": llama_metrics.get("llamacpp:prompt_seconds_total"),
        "role_mismatches": mismatches,
        "prefixpin": extra,
        "per_request": [{k: r[k] for k in PER_REQUEST_KEYS} for r in reqs],
    }


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """prefixpin against the ideal, and the checks.

    The fork target is stated as an absolute ratio, but a fork's first request
    always ends in new text (the parent's last reply, as the trace fixes it, and
    the review prompt), so even the ideal trace stays below 100%.  The check that
    gates the exit code is therefore relative: prefixpin's fork cached ratio must be
    >= 95% of the ideal's; the absolute figure is reported next to the ideal's own.
    (Ratios, not token counts: prefixpin strips the memory counters, so its prompts
    are a few tokens shorter than the ideal's.)
    """
    pp, ideal, pre = results["prefix-via-prefixpin"], results["ideal-direct"], results["prefix-direct"]
    vs_ideal = _div(pp["cached_ratio"], ideal["cached_ratio"])
    forks_vs_ideal = _div(pp["fork_cached_ratio"], ideal["fork_cached_ratio"])
    checks = {
        f"prefixpin cached ratio >= {TARGET_VS_IDEAL:.0%} of ideal": vs_ideal is not None
        and vs_ideal >= TARGET_VS_IDEAL,
        f"prefixpin fork cached ratio >= {TARGET_FORKS:.0%} of ideal's": forks_vs_ideal is not None
        and forks_vs_ideal >= TARGET_FORKS,
        "every role as annotated (root/continuation/fork)": not pp["role_mismatches"],
        "no failed requests": all(r["failed"] == 0 for r in results.values()),
    }
    absolute = pp["fork_cached_ratio"]
    return {
        "prefixpin_vs_ideal_cached_ratio": vs_ideal,
        "prefixpin_vs_ideal_fork_cached_ratio": forks_vs_ideal,
        "prefixpin_fork_cached_ratio": absolute,
        "ideal_fork_cached_ratio": ideal["fork_cached_ratio"],
        "fork_absolute_target_met": absolute is not None and absolute >= TARGET_FORKS,
        "prefixpin_vs_ideal_processed": _div(pp["processed_tokens"], ideal["processed_tokens"]),
        "prefixpin_vs_ideal_wall": _div(pp["request_wall_s"], ideal["request_wall_s"]),
        "prefixpin_vs_ideal_llama_prompt_s": _div(pp["llama_prompt_s"], ideal["llama_prompt_s"]),
        "prefix_direct_vs_ideal_processed": _div(pre["processed_tokens"], ideal["processed_tokens"]),
        "checks": checks,
        "ok": all(checks.values()),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_text(out: dict[str, Any]) -> str:
    head = [
        "run",
        "requests",
        "prompt",
        "cached",
        "processed",
        "cached %",
        "forks cached %",
        "prefill s",
        "wall s",
        "retried",
    ]
    rows = [head]
    for r in out["runs"].values():
        rows.append(
            [
                r["run"],
                str(r["requests"]),
                f"{r['prompt_tokens']:,}",
                f"{r['cached_tokens']:,}",
                f"{r['processed_tokens']:,}",
                _pct(r["cached_ratio"]),
                _pct(r["fork_cached_ratio"]),
                f"{r['llama_prompt_s']:.2f}" if r["llama_prompt_s"] is not None else "-",
                f"{r['request_wall_s']:.2f}",
                str(r["retried"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    git = out["git"]
    lines = [
        f"trace: {out['trace']}   prefixpin: {git['commit']}" + (" (+ uncommitted changes)" if git["dirty"] else "")
    ]
    lines += [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    c = out["comparison"]
    lines += [
        "",
        f"prefixpin vs ideal: cached ratio {_pct(c['prefixpin_vs_ideal_cached_ratio'])}, "
        f"fork cached ratio {_pct(c['prefixpin_vs_ideal_fork_cached_ratio'])}, "
        f"processed tokens {_pct(c['prefixpin_vs_ideal_processed'])}, "
        f"llama prefill time {_pct(c['prefixpin_vs_ideal_llama_prompt_s'])}, wall {_pct(c['prefixpin_vs_ideal_wall'])}",
        f"pre-fix direct processes {c['prefix_direct_vs_ideal_processed']:.2f}x the ideal's tokens",
    ]
    lines += [f"[{'ok' if ok else 'MISS'}] {name}" for name, ok in c["checks"].items()]
    lines.append(
        f"[{'ok' if c['fork_absolute_target_met'] else 'info'}] forks >= {TARGET_FORKS:.0%} cached (absolute): "
        f"prefixpin {_pct(c['prefixpin_fork_cached_ratio'])}, ideal {_pct(c['ideal_fork_cached_ratio'])}"
    )
    mism = out["runs"]["prefix-via-prefixpin"]["role_mismatches"]
    if mism:
        lines.append(f"{len(mism)} request(s) through prefixpin got an unexpected role:")
        lines += [
            f"  line {m['line']} ({m['session']}, {m['kind']}): role {m['role']}, cached {m['cached']}/{m['prompt']}"
            for m in mism
        ]
    for r in out["runs"].values():
        errors = sorted({_PORT.sub("127.0.0.1:PORT", e)[:200] for q in r["per_request"] for e in q["retried"]})
        if errors:
            lines.append(f"{r['run']}: {r['retried']} retried request(s) after:")
            lines += [f"  {e}" for e in errors]
    lines.append(f"logs: {out['log_dir']}")
    return "\n".join(lines)


def _git_state() -> dict[str, Any]:
    """The commit measured, and whether prefixpin's own code differed from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
        except OSError:
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": git("status", "--porcelain", "--", "proxy", "canonicalize").splitlines(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny trace (1 session, 4 turns, one fork)")
    ap.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    ap.add_argument("--sessions", type=int, default=TraceSpec().sessions)
    ap.add_argument("--turns", type=int, default=TraceSpec().turns)
    ap.add_argument("--fork-every", type=int, default=TraceSpec().fork_every)
    ap.add_argument("--seed", type=int, default=TraceSpec().seed)
    ap.add_argument("--work-dir", type=Path, help="where traces and logs go (default: a new temp dir)")
    args = ap.parse_args(argv)
    spec = SMOKE if args.smoke else TraceSpec(args.sessions, args.turns, args.fork_every, args.seed)
    work, log_dir = work_dirs(args.work_dir, "prefixpin-bench-")
    traces = dict(zip(("prefix", "ideal"), write_pair(work, spec), strict=True))
    results: dict[str, dict[str, Any]] = {}
    for run in RUNS:
        print(f"bench: {run.name} ...", file=sys.stderr, flush=True)
        results[run.name] = run_once(run, traces[run.trace], log_dir)
    out: dict[str, Any] = {
        "git": _git_state(),
        "trace": f"sessions={spec.sessions} turns={spec.turns} fork_every={spec.fork_every} seed={spec.seed}",
        "llama": LLAMA,
        "runs": results,
        "comparison": compare(results),
        "log_dir": str(log_dir),
    }
    (work / "report.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(format_text(out))
    return 0 if out["comparison"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
