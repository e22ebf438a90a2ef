"""Where a live request's CPU time goes: named functions of a ``prefixpin serve`` under wrk, timed.

    python -m benchmarks.bench_parts proxy.drive:Driver.canonicalize proxy.drive:Driver.record
    python -m benchmarks.bench_parts --workload mix --conns 1 proxy.handler:Handler.serve
    python -m benchmarks.bench_parts --compare-ref f56259b --ref-parts proxy.addons.canonicalize:Canonicalize.request \\
        -- proxy.addons.canonicalize:Canonicalize.request
    python -m benchmarks.bench_parts --smoke proxy.handler:splice   # a second each: proves it works (CI)

Each ``MODULE:NAME`` (``Class.method`` for a method) is wrapped, in the served
process only (``without/sitecustomize.py``), by a function that counts its calls and
adds up the CPU time of the thread that runs it (``time.thread_time_ns``: waiting
for the network is not counted).  Each session's first request is sent alone
(``overhead.roles.prime``, as ``bench_overhead``'s role sample does); after a
warm-up the count runs for ``--seconds`` of ``wrk -c CONNS``.  The report gives
each part's calls and µs per proxied request, next to the event loop thread's whole
CPU time per request (``/proc``'s schedstat), so a part reads as a share of it.
``--compare-ref`` measures a revision the same way, in turns (``--rounds``), its
parts named by ``--ref-parts`` where they have other names there (default: the
same).

What it measures and what not: the wrapper itself costs ~1 µs per call (more for
an ``async def``), so count a part's figure as that much high; a nested part is
inside its caller's figure too.  An ``async def`` that waits (for the upstream, a
slow store) also counts what the event loop ran meanwhile: other requests' work at
16 connections, little at ``--conns 1``.  A name not in the tree is reported, not
an error (nor is a module the process never imported); a name given twice is (it
would be wrapped twice).  A benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_paired import WITHOUT, run_ns
from benchmarks.overhead import nginx, roles, workloads, wrk
from benchmarks.overhead.rounds import PASSES_PER_RUN
from benchmarks.overhead.targets import CLIENT_HEADERS, Target, checkout, prefixpin
from benchmarks.overhead.tools import BIN_DIR

Part = tuple[str, str]  # module, qualified name


def part_spec(text: str) -> Part:
    """``MODULE:NAME``."""
    module, colon, name = text.partition(":")
    if not colon or not module or not name or "=" in name:
        raise argparse.ArgumentTypeError(f"MODULE:NAME, e.g. proxy.drive:Driver.canonicalize (got {text!r})")
    return module, name


@dataclass
class Timed:
    """One target: its parts, the files its process writes, and what the rounds counted."""

    target: Target
    parts: list[Part]
    done_file: Path  # the names replaced (``!module:name``: not there)
    out_file: Path  # a round's counts
    requests: int = 0
    loop_ns: int = 0
    spent: dict[str, list[int]] = field(default_factory=dict)  # "module:name" -> [calls, ns]
    missing: list[str] = field(default_factory=list)


def timed_target(upstream: str, name: str, source: Path | None, parts: list[Part], work: Path) -> Timed:
    """``prefixpin serve`` (of ``source``, default this tree) with ``parts`` timed."""
    stem = work / name.replace("@", "-")
    done, out = stem.with_suffix(".done"), stem.with_suffix(".timed.json")
    env = {
        "PYTHONPATH": str(WITHOUT),
        "PREFIXPIN_TIMED": json.dumps([list(p) for p in parts]),
        "PREFIXPIN_TIMED_OUT": str(out),
        "PREFIXPIN_WITHOUT_DONE": str(done),
    }
    return Timed(prefixpin(upstream, name=name, source=source, env=env), parts, done, out)


def measure(t: Timed, load: workloads.Workload, conns: int, seconds: int, start: int) -> None:
    """One round: counting switched on for ``seconds`` of wrk, then read."""
    pid = t.target.procs[0].popen.pid
    t.out_file.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    loop0, _ = run_ns(pid)
    got = wrk.run(t.target.url, load.path, conns=conns, duration_s=seconds, start=start, headers=CLIENT_HEADERS)
    loop1, _ = run_ns(pid)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not t.out_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not t.out_file.exists():
        raise SystemExit(f"{t.target.name} wrote no counts within 10 s of the signal (see its log in {BIN_DIR})")
    counted = json.loads(t.out_file.read_text(encoding="utf-8"))
    t.requests += got.requests
    t.loop_ns += loop1 - loop0
    for key, (calls, ns) in counted.items():
        mine = t.spent.setdefault(key, [0, 0])
        mine[0] += calls
        mine[1] += ns


def report(timed: list[Timed], workload: str, conns: int) -> list[str]:
    head = "| part |" + "".join(f" {t.target.name} µs/req | calls/req |" for t in timed)
    out = [f"{workload}, {conns} connection(s):", "", head, "|---|" + "---:|---:|" * len(timed)]
    rows = max(len(t.parts) for t in timed)
    for i in range(rows):
        label = " / ".join(dict.fromkeys(f"{t.parts[i][0]}:{t.parts[i][1]}" for t in timed if i < len(t.parts)))
        cells = []
        for t in timed:
            key = f"{t.parts[i][0]}:{t.parts[i][1]}" if i < len(t.parts) else ""
            calls, ns = t.spent.get(key, [0, 0])
            n = max(t.requests, 1)
            cells.append(" - | - |" if key in t.missing or not key else f" {ns / n / 1000:.1f} | {calls / n:.2f} |")
        out.append(f"| {label} |" + "".join(cells))
    out.append(
        "| the event loop thread, all |" + "".join(f" {t.loop_ns / max(t.requests, 1) / 1000:.1f} | |" for t in timed)
    )
    for t in timed:
        if t.missing:
            out.append(f"\nnot in {t.target.name}: " + ", ".join(t.missing))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_parts", description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+", type=part_spec, metavar="MODULE:NAME", help="the functions to time")
    ap.add_argument("--compare-ref", metavar="REF", help="also git revision REF, in turns")
    ap.add_argument(
        "--ref-parts", type=part_spec, nargs="+", metavar="MODULE:NAME", help="REF's names (default: the same)"
    )
    ap.add_argument("--workload", choices=("body", "mix"), default="body")
    ap.add_argument("--conns", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--seconds", type=int, default=10, help="counted seconds per round (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the targets taking turns (default 2)")
    ap.add_argument("--smoke", action="store_true", help="one round of a second: for CI")
    args = ap.parse_args(argv)
    if args.ref_parts and not args.compare_ref:
        ap.error("--ref-parts names REF's functions: with --compare-ref")
    if args.ref_parts and len(args.ref_parts) != len(args.parts):
        ap.error("--ref-parts: one for each part")
    for named in (args.parts, args.ref_parts or []):
        if len(set(named)) != len(named):
            ap.error("a part named twice would be timed twice, inside itself")
    seconds, rounds = (1, 1) if args.smoke else (args.seconds, args.rounds)
    logs = BIN_DIR / "logs-parts"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefixpin-parts-") as tmp:
        work = Path(tmp)
        load = workloads.named(work, args.workload)
        up_proc, up = nginx.upstream(work, logs)
        timed: list[Timed] = []
        try:
            sides: list[tuple[str, Path | None, list[Part]]] = [("prefixpin", None, args.parts)]
            if args.compare_ref:
                ref = checkout(args.compare_ref, work / "ref")
                sides.append((f"prefixpin@{args.compare_ref}", ref, args.ref_parts or args.parts))
            timed = [timed_target(up, name, source, parts, work) for name, source, parts in sides]
            for t in timed:
                t.target.start(logs)
                if t.target.reason:
                    print(f"{t.target.name} unavailable: {t.target.reason}", file=sys.stderr)
                    return 1
                listed = t.done_file.read_text(encoding="utf-8").split() if t.done_file.exists() else []
                t.missing = [f"{m}:{n}" for m, n in t.parts if f"{m}:{n}" not in listed]
            stretch = PASSES_PER_RUN * len(load.templates)  # request numbers per run: each starts at turn 0
            for n, t in enumerate(timed, start=1):  # warmed up on request numbers no round uses
                roles.warm_up(t.target, load, conns=args.conns, start=n * stretch, seconds=1 if args.smoke else 3)
            run = len(timed)
            for r in range(rounds):
                for t in timed if r % 2 == 0 else timed[::-1]:
                    run += 1
                    measure(t, load, args.conns, seconds, run * stretch)
        finally:
            for t in timed:
                t.target.stop()
            up_proc.stop()
    print("\n".join(report(timed, args.workload, args.conns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
