"""Python bytecode executed per proxied request, by module and function.

    python3 -m benchmarks.bench_opcodes                        # body and mix, this tree (~1 min)
    python3 -m benchmarks.bench_opcodes --compare-ref f56259b  # and revision REF, side by side
    python3 -m benchmarks.bench_opcodes --sessions 1           # the body with one conversation only
    python3 -m benchmarks.bench_opcodes --bypass               # the HTTP shell alone (x-prefixpin-bypass: 1)
    python3 -m benchmarks.bench_opcodes --smoke                # a few requests: proves it works
    python3 -m benchmarks.bench_opcodes --json

``bench_instructions`` counts the machine instructions of the whole process, most of
them in the interpreter's loop, which callgrind cannot attribute to the Python code it
runs.  This counts that code's own work: every bytecode instruction the event loop's
thread executes, by the function it belongs to (a ``sys.settrace`` opcode tracer,
loaded into ``prefixpin serve`` through a ``sitecustomize`` on its PYTHONPATH:
``benchmarks/opcodes/``).  The tracer makes the process ~20x slower, so only counts
are read, never times; counts do not move with the host.  Each target runs in front of
``bench_overhead``'s instant nginx upstream; wrk sends the same workloads at 16
connections: each session's first request alone (``overhead.roles.prime``, as an agent
sends it), a warm-up untraced, then ``--seconds`` traced.  The figure is the
instructions counted over the requests wrk completed.

What it does not see: C code (a library's, the interpreter's own), the kernel, memory
stalls.  Two trees with the same count can differ in speed (the branches their code
takes, the memory it reads), and an instruction in a tight loop costs less than one in
code that calls through many small functions; read it next to ``bench_paired``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.overhead import body, nginx, roles, targets, workloads, wrk
from benchmarks.overhead.targets import CLIENT_HEADERS
from tests.infra.procs import REPO, start_prefixpin

CONNS = 16
WARM_S = 3
SECONDS = 5
TRACER = Path(__file__).resolve().parent / "opcodes"

Counts = dict[tuple[str, str], float]  # (module path in its tree, qualified name) -> instructions per request


def _module(filename: str, tree: Path) -> str:
    """A code object's file as a path in its tree, or in the libraries or the interpreter's."""
    if "/site-packages/" in filename:
        return filename.split("/site-packages/")[-1]
    try:
        return str(Path(filename).resolve().relative_to(tree.resolve()))
    except ValueError:
        return re.sub(r"^.*/python3\.\d+/", "", filename)  # the standard library


def measure(
    tree: Path,
    source: Path | None,
    wl: workloads.Workload,
    work: Path,
    upstream: str,
    seconds: int,
    headers: dict[str, str] = CLIENT_HEADERS,
) -> Counts:
    """One target on one workload (sent with ``headers``): instructions per request by function."""
    out = work / f"opcodes-{os.getpid()}-{time.monotonic_ns()}.tsv"
    env = {"PYTHONPATH": str(TRACER), "PREFIXPIN_OPCODES": str(out)}
    proc, base = start_prefixpin(work / "logs", upstream=upstream, env=env, source=source)
    try:
        url = base + "/v1/chat/completions"
        roles.prime(base, wl, start=10**6)  # each session's first request alone, as an agent sends it
        wrk.run(url, wl.path, conns=CONNS, duration_s=WARM_S, start=10**6, headers=headers)
        pid = proc.popen.pid
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.3)
        load = wrk.run(url, wl.path, conns=CONNS, duration_s=seconds, start=0, timeout_s=60, headers=headers)
        time.sleep(0.5)  # the counting of the last responses
        os.kill(pid, signal.SIGUSR1)
        for _ in range(200):
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{tree}: no counts written ({proc.log_tail(5)})")
    finally:
        proc.stop()
    if load.errors or not load.requests:
        raise SystemExit(f"{tree} {wl.name}: {load.requests} requests, errors {load.errors}")
    counts: Counts = {}
    for line in out.read_text(encoding="utf-8").splitlines():
        n, filename, name = line.split("\t")
        key = (_module(filename, tree), name)
        counts[key] = counts.get(key, 0.0) + int(n) / load.requests
    return counts


def _by_module(counts: Counts) -> dict[str, float]:
    modules: dict[str, float] = {}
    for (module, _), n in counts.items():
        modules[module] = modules.get(module, 0.0) + n
    return modules


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-ref", metavar="REF", help="also measure git revision REF")
    ap.add_argument("--seconds", type=int, default=SECONDS, help="load traced per workload")
    ap.add_argument("--workloads", default="body,mix", help="body, mix or both (comma-separated)")
    ap.add_argument("--sessions", type=int, default=len(body.SESSION_MESSAGES), help="body: conversations sent")
    ap.add_argument("--top", type=int, default=15, help="functions listed")
    ap.add_argument(
        "--bypass", action="store_true", help="x-prefixpin-bypass: 1 on every request: the HTTP shell alone"
    )
    ap.add_argument("--smoke", action="store_true", help="a short run, for CI")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    only = tuple(w.strip() for w in args.workloads.split(","))
    if not only or not set(only) <= {"body", "mix"}:
        raise SystemExit(f"--workloads: body, mix or both, not {args.workloads!r}")
    if not 1 <= args.sessions <= len(body.SESSION_MESSAGES):
        raise SystemExit(f"--sessions: 1 to {len(body.SESSION_MESSAGES)}")
    seconds = 1 if args.smoke else args.seconds
    runs: dict[str, dict[str, Counts]] = {}
    with tempfile.TemporaryDirectory(prefix="prefixpin-opcodes-") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        loads = {
            "body": workloads.repeated(work, args.sessions),
            "mix": workloads.named(work, "mix"),
        }
        up, base = nginx.upstream(work, work / "logs")
        try:
            trees: list[tuple[str, Path, Path | None]] = [("prefixpin", REPO, None)]
            if args.compare_ref:
                ref = targets.checkout(args.compare_ref, work / "ref")
                trees.append((f"prefixpin@{args.compare_ref}", ref, ref))
            for name, tree, source in trees:
                headers = {**CLIENT_HEADERS, "x-prefixpin-bypass": "1"} if args.bypass else CLIENT_HEADERS
                runs[name] = {w: measure(tree, source, loads[w], work, base, seconds, headers) for w in only}
        finally:
            up.stop()
    if args.json:
        out = {
            n: {w: {"per_request": sum(c.values()), "modules": _by_module(c)} for w, c in r.items()}
            for n, r in runs.items()
        }
        print(json.dumps({"connections": CONNS, "seconds": seconds, "runs": out}, indent=2))
        return
    _report(runs, only, args)


def _report(runs: dict[str, dict[str, Counts]], only: tuple[str, ...], args: argparse.Namespace) -> None:
    names = list(runs)
    print(f"Python bytecode instructions per proxied request (event loop thread; wrk, {CONNS} connections):")
    print("| target | " + " | ".join(only) + " |")
    print("|---|" + "---:|" * len(only))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{sum(runs[name][w].values()):,.0f}" for w in only) + " |")
    for w in only:
        ours = runs[names[0]][w]
        if len(names) == 1:
            print(f"\n{w}: the functions that run the most")
            for (module, fn), n in sorted(ours.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {n:8,.0f}  {module}  {fn}")
            continue
        ref = runs[names[1]][w]
        ratio = sum(ours.values()) / sum(ref.values())
        print(f"\n{w}: {ratio:.3f}x the instructions of {names[1]}; the modules that differ most")
        mo, mr = _by_module(ours), _by_module(ref)
        for module in sorted(set(mo) | set(mr), key=lambda m: -abs(mo.get(m, 0) - mr.get(m, 0)))[: args.top]:
            a, b = mo.get(module, 0.0), mr.get(module, 0.0)
            print(f"  {a:8,.0f} {b:8,.0f} {a - b:+8,.0f}  {module}")
        print(f"{w}: functions that differ most (this tree, {names[1]}, difference)")
        for key in sorted(set(ours) | set(ref), key=lambda k: -abs(ours.get(k, 0) - ref.get(k, 0)))[: args.top]:
            a, b = ours.get(key, 0.0), ref.get(key, 0.0)
            print(f"  {a:8,.0f} {b:8,.0f} {a - b:+8,.0f}  {key[0]}  {key[1]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
