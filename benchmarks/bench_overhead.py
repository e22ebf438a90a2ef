"""What prefixpin costs per request, next to nginx, on a 45 KB hermes request.

    python -m benchmarks.bench_overhead                         # ~15 min on 2 cores: markdown tables
    python -m benchmarks.bench_overhead --compare-ref 7c1b9d4   # this tree next to an older one, same rounds
    python -m benchmarks.bench_overhead --smoke                 # a few seconds: proves the benchmark works (CI)
    python -m benchmarks.bench_overhead --json --out r.json     # the same, as JSON

One run starts, on this machine, an instant upstream (nginx ``return 200`` of a
chat completion, one worker; ``--upstream go`` for the Go one), nginx with one
worker proxying to it (the reference), ``prefixpin serve`` from this tree
(default config), and with ``--compare-ref REF`` the code of git revision REF
(``git archive`` into the run's temp dir) served the same way.  It drives each
with wrk (``wrk -t1``; Debian's, installed as root when missing) on two
workloads: one repeated hermes body, and a mix of conversations in which each
request continues one (``overhead/workloads.py``).  Saturation is ``-c16``
(``--conns``), latency is ``-c1``; the targets take turns in each of ``--repeat``
rounds (in reverse order every other round) and each row reports the medians.
Before trusting a ratio to nginx, the report checks that wrk straight to the
upstream out-runs nginx in front of it.

A benchmark, not a test: it asserts nothing about time.  ``--smoke`` exits
non-zero if a target answered with errors (status >= 400, socket errors,
timeouts), could not start, or the mix did not continue its conversations
through prefixpin (``x-prefixpin-role``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from benchmarks.overhead import floor, litellm, nginx, report, roles, targets, tools, workloads, wrk
from benchmarks.overhead.rounds import Phase, Plan, Runner, log, medians
from benchmarks.overhead.targets import Target
from benchmarks.overhead.tools import BIN_DIR, Unavailable, prioritize
from tests.infra.procs import REPO, Proc

TARGETS = (
    "direct",
    "nginx",
    "python-floor",
    "prefixpin",
    "prefixpin-bypass",
    "prefixpin-trace",
    "prefixpin-auto",
    "litellm",
)
DEFAULT = ("direct", "nginx", "prefixpin")
WORKLOADS = ("body", "mix")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="1 s runs, 8 conversations, one round: for CI")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--out", type=Path, help="also write the JSON document here")
    ap.add_argument("--compare-ref", metavar="REF", help="also serve git revision REF as prefixpin@REF")
    ap.add_argument("--targets", default=",".join(DEFAULT), help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of body,mix")
    ap.add_argument("--conns", default="1,16", help="wrk connection counts; 1 gives the latency columns")
    ap.add_argument("--duration", type=int, default=10, help="whole seconds per measured run")
    ap.add_argument("--warmup", type=int, default=2, help="whole seconds of warm-up before each run (0: none)")
    ap.add_argument("--timeout", type=int, default=5, help="wrk's per-request timeout, seconds")
    ap.add_argument("--repeat", type=int, default=3, help="rounds, the targets taking turns in each")
    ap.add_argument("--idle-wait", type=float, default=60.0, help="seconds to wait for other load to leave (0: never)")
    ap.add_argument(
        "--max-other",
        type=float,
        default=0.3,
        metavar="CORES",
        help="measure a run again (up to 3 times) if other processes used more than CORES meanwhile (inf: never)",
    )
    ap.add_argument(
        "--conversations",
        type=int,
        default=workloads.MIX_CONVERSATIONS,
        help="mix: conversations in flight (round robin)",
    )
    ap.add_argument(
        "--turns", type=int, default=workloads.MIX_TURNS, help="mix: turns per conversation before new ones start"
    )
    ap.add_argument(
        "--priority",
        type=int,
        metavar="NICE",
        help="on a shared machine: the scheduling weight of every benchmark process (e.g. -10; root)",
    )
    ap.add_argument("--upstream", choices=("nginx", "go"), default="nginx", help="the instant upstream")
    ap.add_argument("--no-install", action="store_true", help="never install LiteLLM (use it only if present)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.conns, args.duration, args.warmup, args.repeat, args.idle_wait = "1,4", 1, 0, 1, 0.0
        args.max_other = math.inf
        args.conversations, args.turns = 8, 3
    args.conns = sorted({int(c) for c in args.conns.split(",") if c.strip() and int(c) > 0})
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [t for t in args.targets if t not in TARGETS] + [w for w in args.workloads if w not in WORKLOADS]
    if unknown or "direct" not in args.targets or not args.conns or not args.workloads:
        ap.error(f"unknown {unknown}" if unknown else "--targets must include direct; --conns, --workloads non-empty")
    return args


def cmd(*argv: str) -> str:
    """The first line a command prints (stdout, else stderr), or "unknown"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": f"Python {platform.python_version()}",
        "nginx": cmd(nginx.binary(), "-v").replace("nginx version: ", ""),
        "wrk": cmd(wrk.wrk_binary(), "-v").split(" [")[0],
        "loadavg_start": tools.loadavg(),
        "revision": cmd("git", "-C", str(REPO), "describe", "--always", "--dirty"),
    }


def make_targets(args: argparse.Namespace, upstream: Proc, up: str, work: Path) -> list[Target]:
    """The targets in report order; ``prefixpin-bypass`` drives the ``prefixpin`` process."""
    wanted = args.targets
    out = [targets.direct(upstream, up)]
    if "nginx" in wanted:
        out.append(nginx.proxy(up, work))
    if "python-floor" in wanted:
        out.append(floor.target(up))
    pp = targets.prefixpin(up)
    if "prefixpin" in wanted or "prefixpin-bypass" in wanted:
        out.append(pp)
    if args.compare_ref:
        source = targets.checkout(args.compare_ref, work / "ref")
        out.append(targets.prefixpin(up, name=f"prefixpin@{args.compare_ref}", source=source))
    if "prefixpin-bypass" in wanted:
        out.append(targets.prefixpin_bypass(pp))
    if "prefixpin-trace" in wanted:  # the default config, every request recorded (trace.path)
        out.append(targets.prefixpin(up, name="prefixpin-trace", config=recording_config(work)))
    if "prefixpin-auto" in wanted:  # the default config but a worker per CPU
        auto = work / "auto-workers.yaml"
        auto.write_text("listen: {workers: auto}\n")
        out.append(targets.prefixpin(up, name="prefixpin-auto", config=auto))
    if "litellm" in wanted:
        out.append(litellm.target(up, work, install=not (args.smoke or args.no_install)))
    return out


TRACE_MAX_BYTES = 64 << 20  # the recording target rotates (and removes) as it goes: a run writes GBs


def recording_config(work: Path, trace_path: str | None = None) -> Path:
    """``prefixpin-trace``'s config: every request recorded to the run's temp dir (or
    to ``trace_path``)."""
    path = work / "recording.yaml"
    trace = {"path": trace_path or str(work / "trace.jsonl"), "max_bytes": TRACE_MAX_BYTES, "keep": 1}
    path.write_text(json.dumps({"trace": trace}))  # JSON is YAML
    return path


def recorded(work: Path) -> dict[str, int]:
    """What ``prefixpin-trace`` left in its files (the newest two: it removes older ones)."""
    files = sorted(work.glob("trace.jsonl*"))
    return {"files": len(files), "lines": sum(f.read_bytes().count(b"\n") for f in files)}


def sample_roles(all_targets: list[Target], loads: dict[str, workloads.Workload], conversations: int) -> dict[str, Any]:
    """Each prefixpin's roles for the first requests of each workload, sent in wrk's order
    (request numbers below the ones the rounds use, so no run repeats them)."""
    out: dict[str, Any] = {}
    for t in all_targets:
        if not t.name.startswith("prefixpin") or t.alias_of is not None or t.base is None:
            continue
        for name, w in loads.items():
            count = 2 * conversations if name == "mix" else 2 * len(w.templates)  # two turns of each
            out[f"{name} {t.name}"] = dict(roles.sample(t.base, w, start=0, count=count))
    return out


def run_all(args: argparse.Namespace, plan: Plan) -> tuple[list[Target], list[dict[str, Any]], dict[str, Any]]:
    """Start everything, check the roles, run every phase against every target, stop everything."""
    logs = BIN_DIR / "logs-last"  # the last run's process logs, kept for a look after it
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    log(f"process logs: {logs}")
    with tempfile.TemporaryDirectory(prefix="prefixpin-bench-") as tmp:
        work = Path(tmp)
        loads = {
            "body": workloads.repeated(work),
            "mix": workloads.conversations(work, args.conversations, args.turns),
        }
        loads = {k: v for k, v in loads.items() if k in args.workloads}
        if args.upstream == "nginx":
            up_proc, up = nginx.upstream(work, logs)
        else:
            up_proc, up = targets.start_upstream(logs)
        prioritize(up_proc.popen.pid, args.priority)
        all_targets: list[Target] = []
        try:
            all_targets = make_targets(args, up_proc, up, work)
            for t in all_targets:
                t.priority = args.priority
            for t in all_targets:
                log(f"starting {t.name} ...")
                t.start(logs)
                if t.reason:
                    log(f"  {t.name} unavailable: {t.reason}")
            sample = sample_roles(all_targets, loads, args.conversations)
            for key, counts in sample.items():
                log(f"role sample, {key}: {roles.share(counts)}")
            runs = Runner(loads, logs, plan).run(all_targets)
            trace = recorded(work) if "prefixpin-trace" in args.targets else None
        finally:
            for t in all_targets:
                t.stop()
            up_proc.stop()
    extra = {
        "workloads": {k: {"name": k, "about": w.about, "bytes": list(w.sizes)} for k, w in loads.items()},
        "role_sample": sample,
        "recorded": trace,
    }
    return all_targets, runs, extra


def failures(doc: dict[str, Any]) -> list[str]:
    """What makes ``--smoke`` fail: errors, a target that did not start, a mix that did not continue."""
    bad = [
        f"{r['target']} {r['phase']}: {r.get('unavailable') or r['error_kinds']}"
        for r in doc["runs"]
        if r.get("unavailable") or r.get("errors")
    ]
    bad += [f"{name} unavailable: {t['reason']}" for name, t in doc["targets"].items() if t.get("reason")]
    for key, counts in doc["role_sample"].items():
        if any(k.startswith("status_") for k in counts):
            bad.append(f"role sample {key}: {counts}")
        if key.startswith("mix ") and not counts.get("continuation"):
            bad.append(f"role sample {key}: no continuation ({counts})")
    if doc.get("recorded") is not None and not doc["recorded"]["lines"]:
        bad.append("prefixpin-trace recorded nothing")
    return bad


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phases = tuple(Phase(w, c) for w in args.workloads for c in sorted(args.conns, reverse=True))
    plan = Plan(
        phases,
        args.duration,
        args.warmup,
        args.timeout,
        settle_s=3.0 if args.smoke else 15.0,
        idle_wait_s=args.idle_wait,
        repeat=max(1, args.repeat),
        max_other=None if math.isinf(args.max_other) else args.max_other,
        priority=args.priority,
    )
    info = machine()
    all_targets, every_run, extra = run_all(args, plan)
    runs = medians(every_run)
    info["loadavg_end"] = tools.loadavg()
    upstream = "nginx `return 200` (one worker)" if args.upstream == "nginx" else "the Go upstream (upstream/main.go)"
    doc: dict[str, Any] = {
        "date": date.today().isoformat(),
        "command": shlex.join(["python", "-m", "benchmarks.bench_overhead", *(sys.argv[1:] if argv is None else argv)]),
        "machine": info,
        "upstream": upstream,
        "config": {
            "workloads": args.workloads,
            "conns": args.conns,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "timeout_s": args.timeout,
            "repeat": plan.repeat,
            "conversations": args.conversations,
            "turns": args.turns,
            "compare_ref": args.compare_ref,
            "idle_wait_s": args.idle_wait,
            "max_other": plan.max_other,
            "priority": args.priority,
            "smoke": args.smoke,
        },
        **extra,
        "targets": {t.name: ({"reason": t.reason} if t.reason else {"url": t.url}) for t in all_targets},
        "runs": runs,
        "every_round": every_run,
    }
    doc["generator_check"] = report.generator_check(runs, args.workloads, max(args.conns))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2) if args.json else report.render(doc))
    for w, measured, ok in doc["generator_check"]:
        if ok is False:
            log(f"WARNING: {w}: wrk straight to the upstream does not out-run nginx ({measured}); "
                "the ratios to nginx are capped by the generator or the upstream, not by nginx")  # fmt: skip
    bad = failures(doc) if args.smoke else []
    if bad:
        log("smoke run failed: " + "; ".join(bad))
        return 1
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # The targets run in sessions of their own: unwinding through run_all's finally stops them.
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        raise SystemExit(main())
    except Unavailable as exc:
        raise SystemExit(f"bench_overhead: {exc}") from None
