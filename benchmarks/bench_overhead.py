"""What prefixpin adds to a request, next to no proxy, nginx and LiteLLM.

    python -m benchmarks.bench_overhead            # full run (~8 min on 2 cores), markdown tables
    python -m benchmarks.bench_overhead --smoke    # a few seconds once built: proves the script works (CI)
    python -m benchmarks.bench_overhead --json     # the same, as JSON
    python -m benchmarks.bench_overhead --compare-ref 346c122 --conns 1,32   # this tree next to an older one

One run starts, in one process tree on this machine: the instant Go upstream
(benchmarks/overhead/upstream), prefixpin (default config), nginx and LiteLLM
in front of it, then drives each with the open-loop Go load generator
(benchmarks/overhead/loadgen) at fixed rates and in saturation.  It builds the
Go binaries, installs nginx-light (as root, if missing) and LiteLLM (from
requirements-litellm.lock into ~/.cache/prefixpin/litellm-venv) as needed; a
target it cannot have is reported as "unavailable: <reason>".  ``--compare-ref REF``
adds the target ``prefixpin@REF`` (and ``prefixpin-bypass@REF`` with
``prefixpin-bypass``): the code of git revision REF (exported with
``git archive`` into the run's temp dir) served the same way, measured in the
same run, so before/after ratios hold on a noisy machine.  A benchmark,
not a test: it prints figures and judges the issue's targets, it asserts
nothing about time.  ``--smoke`` exits non-zero if direct, prefixpin or nginx
returned any error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from benchmarks.overhead import body, report, targets
from benchmarks.overhead.run import Phase, Plan, Runner, log, medians
from benchmarks.overhead.targets import Target
from benchmarks.overhead.tools import BIN_DIR, Unavailable, go_binary
from tests.infra.procs import Proc

Run = dict[str, Any]

TARGETS = ("direct", "prefixpin", "prefixpin-auto", "prefixpin-bypass", "nginx", "litellm")
DEFAULT = tuple(t for t in TARGETS if t != "prefixpin-auto")  # that one on request
STRICT = ("direct", "prefixpin", "prefixpin-bypass", "nginx")  # --smoke fails on any error of these


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny rates, 1 s runs; LiteLLM only if installed")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--rates", default="25,50,200,500", help="open-loop rates, non-streamed (req/s)")
    ap.add_argument("--stream-rates", default="25,200", help="open-loop rates, streamed (req/s)")
    ap.add_argument(
        "--conns",
        default="32",
        help="closed loop: comma-separated connection counts; the largest is saturation (0: skip)",
    )
    ap.add_argument("--compare-ref", metavar="REF", help="also run prefixpin at git revision REF, as prefixpin@REF")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each run")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-request timeout (an error past it)")
    ap.add_argument("--targets", default=",".join(DEFAULT), help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument(
        "--idle-wait",
        type=float,
        default=15.0,
        help="seconds to wait before each run for other processes to leave the CPU (0: never)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds per phase, the targets taking turns in each; each row reports the medians",
    )
    ap.add_argument("--no-install", action="store_true", help="never install LiteLLM (use it only if present)")
    ap.add_argument("--out", type=Path, help="also write the JSON document here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rates, args.stream_rates, args.conns = "20", "20", "4"
        args.duration, args.warmup, args.timeout, args.idle_wait = 1.0, 0.3, 5.0, 0.0
    args.closed = [int(c) for c in args.conns.split(",") if c.strip() and int(c) > 0]
    args.conns = max(args.closed, default=0)
    return args


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cmd(*argv: str) -> str:
    """The first line a command prints (stdout, else stderr), or "unknown"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def litellm_version() -> str:
    if not targets.litellm_installed():
        return "not installed"
    return cmd(str(targets.litellm_python()), "-c", "import importlib.metadata as m; print(m.version('litellm'))")


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in _lines("/proc/cpuinfo") if ln.startswith("model name"))
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": f"Python {platform.python_version()}",
        "go": cmd("go", "version").replace("go version ", ""),
        "nginx": cmd("nginx", "-v").replace("nginx version: ", ""),
        "litellm": litellm_version(),
        "loadavg_start": loadavg(),
        "revision": cmd("git", "-C", str(targets.REPO), "describe", "--always", "--dirty"),
    }


def plan_of(args: argparse.Namespace) -> Plan:
    rates, stream_rates = _floats(args.rates), _floats(args.stream_rates)
    phases = tuple(
        [Phase(False, rate=r) for r in rates]
        + [Phase(True, rate=r) for r in stream_rates]
        + [Phase(stream, conns=c) for c in args.closed for stream in (False, True)]
    )
    return Plan(
        phases,
        args.duration,
        args.warmup,
        args.timeout,
        settle_s=3.0 if args.smoke else 15.0,
        idle_wait_s=args.idle_wait,
        repeat=max(1, args.repeat),
    )


def make_targets(
    wanted: list[str], upstream: Proc, up: str, work: Path, *, install: bool, ref: str | None = None
) -> list[Target]:
    """The targets in report order; ``prefixpin-bypass`` drives the ``prefixpin`` process."""
    out = [targets.direct(upstream, up)]
    pp = targets.prefixpin(up)
    if "prefixpin" in wanted or "prefixpin-bypass" in wanted:
        out.append(pp)
    old = None
    if ref:
        old = targets.prefixpin(up, name=f"prefixpin@{ref}", source=targets.checkout(ref, work / "ref"))
        out.append(old)
    if "prefixpin-auto" in wanted:  # the default config but a worker per CPU (listen.workers: auto)
        auto = work / "auto-workers.yaml"
        auto.write_text("listen: {workers: auto}\n")
        out.append(targets.prefixpin(up, name="prefixpin-auto", config=auto))
    if "prefixpin-bypass" in wanted:
        out.append(targets.prefixpin_bypass(pp))
        if old is not None:  # the shell alone, before and after
            out.append(targets.prefixpin_bypass(old, name=f"prefixpin-bypass@{ref}"))
    if "nginx" in wanted:
        out.append(targets.nginx(up, work))
    if "litellm" in wanted:
        out.append(targets.litellm(up, work, install=install))
    return out


def write_bodies(work: Path) -> tuple[dict[bool, Path], list[int]]:
    bodies = {}
    for stream in (False, True):
        path = work / f"bodies-{'stream' if stream else 'plain'}.jsonl"
        path.write_text("\n".join(body.templates(stream=stream)) + "\n", encoding="utf-8")
        bodies[stream] = path
    return bodies, [len(t.encode()) for t in body.templates(stream=False)]


def run_all(args: argparse.Namespace, wanted: list[str], plan: Plan) -> tuple[list[Target], list[Run], list[int]]:
    """Start everything, run every phase against every target, stop everything."""
    loadgen = go_binary("loadgen")
    logs = BIN_DIR / "logs-last"  # the last run's process logs, kept for a look after it
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    log(f"process logs: {logs}")
    with tempfile.TemporaryDirectory(prefix="prefixpin-bench-") as tmp:
        work = Path(tmp)
        bodies, sizes = write_bodies(work)
        up_proc, up = targets.start_upstream(logs)
        install = not (args.smoke or args.no_install)
        all_targets = make_targets(wanted, up_proc, up, work, install=install, ref=args.compare_ref)
        try:
            for t in all_targets:
                log(f"starting {t.name} ...")
                t.start(logs)
                if t.reason:
                    log(f"  {t.name} unavailable: {t.reason}")
            runs = Runner(loadgen, bodies, logs, plan).run(all_targets)
        finally:
            for t in all_targets:
                t.stop()
            up_proc.stop()
    return all_targets, runs, sizes


def smoke_failures(all_targets: list[Target], runs: list[Run]) -> list[str]:
    bad = [
        f"{r['target']} {r['phase']}: {r.get('unavailable') or r['error_kinds']}"
        for r in runs
        if r["target"] in STRICT and (r.get("unavailable") or r["errors"])
    ]
    return bad + [f"{t.name} unavailable" for t in all_targets if t.name in ("direct", "prefixpin") and t.reason]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TARGETS]
    if unknown or "direct" not in wanted:
        sys.exit(f"--targets: unknown {unknown}" if unknown else "--targets must include direct")
    plan = plan_of(args)
    log("building the Go upstream and load generator (cached after the first run) ...")
    info = machine()
    all_targets, every_run, sizes = run_all(args, wanted, plan)
    runs = medians(every_run)
    info["loadavg_end"] = loadavg()
    info["litellm"] = litellm_version()
    doc: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": info,
        "config": {
            "phases": [p.key for p in plan.phases],
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "timeout_s": args.timeout,
            "conns": args.conns,
            "closed_conns": args.closed,
            "compare_ref": args.compare_ref,
            "smoke": args.smoke,
            "idle_wait_s": args.idle_wait,
            "repeat": plan.repeat,
        },
        "body_bytes": [min(sizes), max(sizes)],
        "targets": {t.name: ({"reason": t.reason} if t.reason else {"url": t.url}) for t in all_targets},
        "runs": runs,
    }
    rates = _floats(args.rates)
    doc["verdict"] = report.verdict(runs, rates, args.conns) if rates else []
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2) if args.json else report.render(doc))
    failures = smoke_failures(all_targets, runs) if args.smoke else []
    if failures:
        log("smoke run failed: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Unavailable as exc:
        raise SystemExit(f"bench_overhead: {exc}") from None
