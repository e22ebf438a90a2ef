"""Instructions per proxied request: a figure a noisy host does not move.

    python3 -m benchmarks.bench_instructions                        # body and mix, this tree (~3 min)
    python3 -m benchmarks.bench_instructions --compare-ref f56259b  # and revision REF, side by side
    python3 -m benchmarks.bench_instructions --smoke                # 2 connections, a few seconds: proves it works
    python3 -m benchmarks.bench_instructions --workloads body      # one workload
    python3 -m benchmarks.bench_instructions --json
    python3 -m benchmarks.bench_instructions --branches             # and mispredicted branches (slower)
    python3 -m benchmarks.bench_instructions --caches               # and cache misses (slower)

Throughput and CPU time on a shared host move by 10-25% between rounds (other
machines' load, caches); a change of a few percent is lost in that.  The number of
instructions the process executes per request does not move with the host.  Each
target is ``prefixpin serve`` (default config) run under valgrind's callgrind (~50x
slower), in front of ``bench_overhead``'s instant nginx upstream; wrk sends the same
workloads with the same credentials (``benchmarks.overhead``) at 16 connections:
first each session's first request alone (``overhead.roles.prime``, as an agent sends
it), a warm-up, then callgrind's counters are zeroed (``callgrind_control -z``),
then ``--seconds`` of load, then the counters are dumped (``callgrind_control -d``).
The figure is the dump's instructions (Ir) over the requests wrk completed.

``--branches`` adds callgrind's branch simulation: the conditional and indirect
branches its predictor model mispredicts per request (each costs the CPU some 15-20
cycles of work thrown away: where two trees run the same number of instructions at
different speeds, this is one place to look).

``--caches`` adds callgrind's cache simulation: the first level's misses (32 KiB
each for instructions and data) and a last level sized as one core's L2 on the
machine of docs/bench-overhead.md (1 MiB; not the shared L3: a request's memory
comes back from L2 or further when other requests ran on the core in between),
per request.  The model has no prefetcher and no TLB, so read its counts as a
direction.

What it does not see: the kernel's work, the writer thread's share of a batch,
and (without ``--caches``) time spent waiting on memory.  It complements ``bench_overhead``,
it does not replace it.  Needs ``valgrind`` (Debian package; ./scripts/test
installs it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.overhead import nginx, roles, targets, workloads, wrk
from benchmarks.overhead.targets import CLIENT_HEADERS
from tests.infra.procs import REPO, Proc, free_port, prefixpin_argv

CONNS = 16
# --smoke: few enough connections that requests complete in its few seconds under callgrind
# on a slow host (16 in flight at ~100x slower each may leave none done in 2 s).
SMOKE_CONNS, SMOKE_S = 2, 4
WARM_S = 10
SECONDS = 20
# --caches: callgrind's two levels as size,ways,line (module docstring).
CACHE_MODEL = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,8,64")
CACHE_EVENTS = {  # per request, each the sum of callgrind's events named
    "I1 misses": ("I1mr",),
    "D1 misses": ("D1mr", "D1mw"),
    "L2 misses": ("ILmr", "DLmr", "DLmw"),
}


def measure(
    name: str,
    source: Path | None,
    upstream: str,
    work: Path,
    logs: Path,
    seconds: int,
    warm: int,
    only: tuple[str, ...],
    branches: bool = False,
    caches: bool = False,
    conns: int = CONNS,
) -> dict[str, Any]:
    """One target: instructions (and with ``branches`` mispredicted branches) per request
    on each workload (its own process per workload), ``conns`` connections."""
    out: dict[str, Any] = {}
    for wl in (workloads.named(work, "body"), workloads.named(work, "mix")):
        if wl.name not in only:
            continue
        dump = work / f"callgrind-{name}-{wl.name}.out"
        port = free_port()
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}", "--dump-instr=no"]
        if branches:
            argv.append("--branch-sim=yes")
        if caches:
            argv += ["--cache-sim=yes", *CACHE_MODEL]
        # This checkout's code (or ``source``'s), not the prefixpin on PATH: that may be
        # another tree's editable install.
        argv += [*prefixpin_argv(source or REPO), "serve", "--upstream", upstream, "--port", str(port)]
        proc = Proc(f"{name}-{wl.name}".replace("@", "-"), argv, logs, cwd=source or REPO)
        try:
            base = f"http://127.0.0.1:{port}"
            proc.wait_http(base + "/healthz", timeout=300)
            url = base + "/v1/chat/completions"
            roles.prime(base, wl, start=0)  # each session's first request alone, as an agent sends it
            wrk.run(url, wl.path, conns=conns, duration_s=warm, timeout_s=30, headers=CLIENT_HEADERS)
            _control("-z", proc)
            load = wrk.run(
                url, wl.path, conns=conns, duration_s=seconds, start=10**6, timeout_s=30, headers=CLIENT_HEADERS
            )
            _control("-d", proc)
            events = _totals(dump)
        finally:
            proc.stop()
        if load.errors or not load.requests:
            raise SystemExit(f"{name} {wl.name}: {load.requests} requests, errors {load.errors}")
        out[wl.name] = {"requests": load.requests, "instructions_per_request": events["Ir"] / load.requests}
        if branches:
            out[wl.name]["mispredicted_per_request"] = (events["Bcm"] + events["Bim"]) / load.requests
        if caches:
            for label, names in CACHE_EVENTS.items():
                out[wl.name][label] = sum(events[n] for n in names) / load.requests
    return out


def _control(flag: str, proc: Proc) -> None:
    """``callgrind_control`` on the process (it answers within a second or two)."""
    done = subprocess.run(["callgrind_control", flag, str(proc.popen.pid)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"callgrind_control {flag}: {done.stdout}{done.stderr}")


def _totals(dump: Path) -> dict[str, int]:
    """The event totals (``Ir``, and ``Bcm``/``Bim`` with branch simulation) of the dump
    ``callgrind_control -d`` wrote (``dump.1``, or the newest part)."""
    for _ in range(100):
        parts = sorted(dump.parent.glob(dump.name + ".*"), key=lambda p: p.stat().st_mtime)
        if parts:
            names: list[str] = []
            for line in parts[-1].read_text(errors="replace").splitlines():
                if line.startswith("events:"):
                    names = line.split()[1:]
                elif line.startswith(("summary:", "totals:")) and names:
                    return dict(zip(names, map(int, line.split()[1:]), strict=False))
        time.sleep(0.2)
    raise SystemExit(f"no callgrind dump at {dump}.*")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-ref", metavar="REF", help="also measure git revision REF")
    ap.add_argument("--seconds", type=int, default=SECONDS, help="load measured per workload")
    ap.add_argument("--workloads", default="body,mix", help="body, mix or both (comma-separated)")
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    ap.add_argument("--branches", action="store_true", help="also mispredicted branches (callgrind's model)")
    ap.add_argument("--caches", action="store_true", help="also cache misses (callgrind's model, module docstring)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    seconds, warm = (SMOKE_S, 2) if args.smoke else (args.seconds, WARM_S)
    conns = SMOKE_CONNS if args.smoke else CONNS
    only = tuple(w.strip() for w in args.workloads.split(","))
    if not only or not set(only) <= {"body", "mix"}:
        raise SystemExit(f"--workloads: body, mix or both, not {args.workloads!r}")
    with tempfile.TemporaryDirectory(prefix="prefixpin-instructions-") as tmp:
        work = Path(tmp)
        logs = work / "logs"
        logs.mkdir()
        up, base = nginx.upstream(work, logs)
        try:
            runs = {
                "prefixpin": measure(
                    "prefixpin", None, base, work, logs, seconds, warm, only, args.branches, args.caches, conns
                )
            }
            if args.compare_ref:
                source = targets.checkout(args.compare_ref, work / "ref")
                runs[f"prefixpin@{args.compare_ref}"] = measure(
                    f"prefixpin@{args.compare_ref}",
                    source,
                    base,
                    work,
                    logs,
                    seconds,
                    warm,
                    only,
                    args.branches,
                    args.caches,
                    conns,
                )
        finally:
            up.stop()
    if args.json:
        print(json.dumps({"connections": conns, "seconds": seconds, "runs": runs}, indent=2))
        return
    _table(
        f"Instructions per proxied request (callgrind; wrk, {conns} connections, {seconds} s per workload):",
        runs,
        "instructions_per_request",
        1e6,
        "M",
        digits=3,
    )
    if args.branches:
        title = "Mispredicted branches per request (callgrind's model; conditional + indirect):"
        _table("\n" + title, runs, "mispredicted_per_request", 1e3, "K")
    if args.caches:
        for label in CACHE_EVENTS:
            _table(f"\n{label} per request (callgrind's model: {' '.join(CACHE_MODEL)}):", runs, label, 1e3, "K")
    if args.compare_ref:
        ours, ref = runs["prefixpin"], runs[f"prefixpin@{args.compare_ref}"]
        for w in only:
            ratio = ours[w]["instructions_per_request"] / ref[w]["instructions_per_request"]
            print(f"- {w}: {ratio:.3f}x the instructions of {args.compare_ref}")
            if args.branches:
                missed = ours[w]["mispredicted_per_request"] / ref[w]["mispredicted_per_request"]
                print(f"- {w}: {missed:.3f}x the mispredicted branches of {args.compare_ref}")
            if args.caches:
                for label in CACHE_EVENTS:
                    print(f"- {w}: {ours[w][label] / ref[w][label]:.3f}x the {label} of {args.compare_ref}")
    sys.stdout.flush()


def _table(title: str, runs: dict[str, Any], field: str, unit: float, suffix: str, digits: int = 1) -> None:
    """One figure per target and workload (``field`` over ``unit``, then ``suffix``), as a
    table under ``title``."""
    print(title)
    print("| target | body | mix |")
    print("|---|---:|---:|")
    for name, run in runs.items():
        cells = [f"{run[w][field] / unit:.{digits}f} {suffix}" if w in run else "-" for w in ("body", "mix")]
        print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
