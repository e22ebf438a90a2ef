"""Where a live request's CPU time goes in machine code: ``perf record`` on a ``prefixpin serve`` under wrk.

    python -m benchmarks.bench_perf                          # the body, this tree (~1 min)
    python -m benchmarks.bench_perf --compare-ref f56259b    # and revision REF, in turns, side by side
    python -m benchmarks.bench_perf --workload mix --top 40
    python -m benchmarks.bench_perf --smoke                  # a second each: proves it works (CI)

Each target is ``prefixpin serve`` in front of ``bench_overhead``'s instant nginx
upstream, sent the same workloads with the same credentials at ``--conns``
connections: first each session's first request alone (``overhead.roles.prime``),
a warm-up, then ``--rounds`` rounds in which each target in turn runs ``--seconds``
of wrk under ``perf record -e cpu-clock`` (a timer's samples: it needs no hardware
counters, so it works in a VM that has none), at ``--freq`` samples per second of
CPU.  The report gives, per shared object and per symbol (C function; ``[k]`` the
kernel's), the µs of CPU per request the samples stand for, over the requests wrk
completed.

What it tells that the others do not: ``bench_instructions`` (callgrind) counts the
instructions a request runs, not how long they take; ``bench_parts`` and py-spy
time Python functions, not the C under them.  Here the interpreter's loop
(``_PyEval_EvalFrameDefault``) holds the Python code's own time, the time it waits
on memory included: where two trees run about as many instructions and one takes
longer in that loop, the difference is the memory its code and objects wait for.
A benchmark, not a test: it asserts nothing about time.  Needs ``perf`` (Debian
``linux-perf``; ./scripts/test installs it) and a ``kernel.perf_event_paranoid``
that lets it sample a process it did not start (root, or 2 or less).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.overhead import nginx, roles, workloads, wrk
from benchmarks.overhead.rounds import PASSES_PER_RUN
from benchmarks.overhead.targets import CLIENT_HEADERS, Target, checkout, prefixpin
from benchmarks.overhead.tools import BIN_DIR

_ROW = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")  # perf report -n --sort dso,sym


class Sampled:
    """One target and the samples its rounds collected."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.requests = 0
        self.samples: collections.Counter[tuple[str, str]] = collections.Counter()  # (dso, symbol) -> samples


def record(s: Sampled, load: workloads.Workload, conns: int, seconds: int, start: int, freq: int, out: Path) -> None:
    """One round: ``seconds`` of wrk with ``perf record`` on the target's process."""
    pid = s.target.procs[0].popen.pid
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(freq), "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        got = wrk.run(s.target.url, load.path, conns=conns, duration_s=seconds, start=start, headers=CLIENT_HEADERS)
    finally:
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=60)
    if perf.returncode not in (0, -signal.SIGINT) or not out.exists():
        raise SystemExit(f"perf record failed ({perf.returncode}): {err.decode(errors='replace')[-500:]}")
    s.requests += got.requests
    s.samples.update(read(out))


def read(data: Path) -> collections.Counter[tuple[str, str]]:
    """Samples per (shared object, symbol) in a ``perf record`` file."""
    shown = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "-n", "--sort", "dso,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in shown.splitlines():
        m = _ROW.match(line)
        if m:
            samples, dso, kind, sym = m.groups()
            found[(dso, f"[k] {sym}" if kind == "k" else sym)] += int(samples)
    return found


def report(sampled: list[Sampled], freq: int, top: int, workload: str, conns: int) -> list[str]:
    """The tables: µs of CPU per request by shared object, then the top symbols."""

    def us(s: Sampled, n: int) -> float:
        return n / freq * 1e6 / max(s.requests, 1)

    names = " |".join(f" {s.target.name}" for s in sampled)
    out = [f"{workload}, {conns} connections; µs of CPU per request (perf record -e cpu-clock at {freq} Hz):", ""]
    out += [f"| shared object |{names} |", "|---|" + "---:|" * len(sampled)]
    dsos: list[collections.Counter[str]] = []
    for s in sampled:
        per: collections.Counter[str] = collections.Counter()
        for (dso, _), n in s.samples.items():
            per[dso] += n
        dsos.append(per)
    for dso in sorted(set().union(*dsos), key=lambda d: -max(per[d] for per in dsos))[:12]:
        out.append(f"| {dso} |" + "".join(f" {us(s, per[dso]):.1f} |" for s, per in zip(sampled, dsos, strict=True)))
    out.append("| all |" + "".join(f" {us(s, sum(s.samples.values())):.1f} |" for s in sampled))
    out += ["", f"| symbol (shared object) |{names} |", "|---|" + "---:|" * len(sampled)]
    keys = set().union(*(s.samples for s in sampled))
    first = sampled[0]

    def weight(key: tuple[str, str]) -> float:  # the largest, or (two targets) the largest difference
        cells = [us(s, s.samples[key]) for s in sampled]
        return abs(cells[0] - cells[1]) if len(cells) == 2 else cells[0]

    for key in sorted(keys, key=lambda k: (-weight(k), -us(first, first.samples[k])))[:top]:
        dso, sym = key
        out.append(f"| {sym[:70]} ({dso}) |" + "".join(f" {us(s, s.samples[key]):.1f} |" for s in sampled))
    out.append("")
    out.append(", ".join(f"{s.target.name}: {s.requests} requests" for s in sampled))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_perf", description=__doc__.splitlines()[0])
    ap.add_argument("--compare-ref", metavar="REF", help="also git revision REF, in turns")
    ap.add_argument("--workload", choices=("body", "mix"), default="body")
    ap.add_argument("--conns", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--seconds", type=int, default=10, help="sampled seconds per round (default 10)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the targets taking turns (default 2)")
    ap.add_argument("--freq", type=int, default=4999, help="samples per second of CPU (default 4999)")
    ap.add_argument("--top", type=int, default=25, help="symbols listed (default 25; by difference with REF)")
    ap.add_argument("--smoke", action="store_true", help="one round of a second: for CI")
    args = ap.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 1
    seconds, rounds = (1, 1) if args.smoke else (args.seconds, args.rounds)
    logs = BIN_DIR / "logs-perf"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefixpin-perf-") as tmp:
        work = Path(tmp)
        load = workloads.named(work, args.workload)
        up_proc, up = nginx.upstream(work, logs)
        sampled: list[Sampled] = []
        try:
            sides: list[tuple[str, Path | None]] = [("prefixpin", None)]
            if args.compare_ref:
                sides.append((f"prefixpin@{args.compare_ref}", checkout(args.compare_ref, work / "ref")))
            sampled = [Sampled(prefixpin(up, name=name, source=source)) for name, source in sides]
            stretch = PASSES_PER_RUN * len(load.templates)  # request numbers per run: each starts at turn 0
            for n, s in enumerate(sampled, start=1):  # warmed up on request numbers no round uses
                s.target.start(logs)
                if s.target.reason or s.target.base is None:
                    print(f"{s.target.name} unavailable: {s.target.reason}", file=sys.stderr)
                    return 1
                roles.warm_up(s.target, load, conns=args.conns, start=n * stretch, seconds=1 if args.smoke else 3)
            run = len(sampled)
            for r in range(rounds):
                for s in sampled if r % 2 == 0 else sampled[::-1]:
                    run += 1
                    out = work / f"perf-{run}.data"
                    record(s, load, args.conns, seconds, run * stretch, args.freq, out)
                    out.unlink()
        finally:
            for s in sampled:
                s.target.stop()
            up_proc.stop()
    print("\n".join(report(sampled, args.freq, args.top, args.workload, args.conns)))
    empty = [s.target.name for s in sampled if not s.samples or not s.requests]
    if empty:
        print(f"no samples or no requests: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
