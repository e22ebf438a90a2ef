"""Two prefixpins side by side in one-second slices: a small difference told from the host's drift.

    python -m benchmarks.bench_paired                          # prefixpin against itself recording every request
    python -m benchmarks.bench_paired --compare-ref f56259b    # this tree against git revision f56259b instead
    python -m benchmarks.bench_paired --workload mix           # the conversation mix (default: body)
    python -m benchmarks.bench_paired --trace-path /dev/null   # recording to there (default: a file, rotated)
    python -m benchmarks.bench_paired --runs 3 --slices 30     # three runs, each with fresh processes
    python -m benchmarks.bench_paired --smoke                  # two slices each: proves it works (CI)
    python -m benchmarks.bench_paired --without proxy.addons.measure:Measure.done   # a part switched off
    python -m benchmarks.bench_paired --compare-ref f56259b --bypass   # the HTTP shell alone, both sides
    python -m benchmarks.bench_paired --env PYTHONMALLOC=malloc        # against itself, another environment
    python -m benchmarks.bench_paired --compare-ref f56259b --warm-up 120   # processes that served 2 minutes

``bench_overhead`` measures each target for 10 s in a round; on a shared host whose
speed moves by up to a quarter from one 10-s run to the next, its rounds spread
wider than a 5% difference.  Here the two targets take turns every second (wrk
``-c16 -d1s`` against each, ``--slices`` times, in reverse order every other turn),
so a drift weighs on both alike, and each slice gives a ratio; the report is the
median ratio with its interquartile range.  (Before the warm-up each session's
first request is sent alone, as ``bench_overhead``'s role sample does:
``overhead.roles.prime``.)  Besides req/s it reports the CPU each
target spent per request, of its event loop thread alone (the thread every request
waits for) and of the whole process (with the recording writer thread), read from
``/proc/PID/task/TID/schedstat`` (nanoseconds, not clock ticks), and the process's
split of it into user and system (kernel) time, read from ``/proc/PID/stat`` (clock
ticks: ~1% of a slice's).

A run's median ratio moves by about a percent from one run to the next, more than
its interquartile range suggests: each run starts fresh processes (another hash
seed, another memory layout, other cores).  ``--runs N`` starts the pair N times
and reports each run and the median of the runs' medians.

``--without MODULE:NAME[=VALUE]`` (repeatable) pairs prefixpin with itself where the
function ``NAME`` of ``MODULE`` (``Class.method`` for a method, named as its callers
look it up) does nothing and returns ``VALUE`` (a Python literal; default None):
what that part of a request's life costs live, an upper bound of what making it
cheaper can give (``without/sitecustomize.py`` replaces it, in that process only;
the run stops if a name is not there).  What it leaves out must leave the requests
what they were: switch off a counting hook, not a step whose answer the next needs.

``--env NAME=VALUE`` (repeatable) starts the second prefixpin (this tree) with these
environment variables: against itself when neither ``--compare-ref`` nor
``--without`` is given, so an interpreter's or a library's setting is measured.

``--warm-up SECONDS`` (default 3) is how long each process serves before its first
slice, at the slices' connections, on request numbers no slice uses.  A fresh
process serves faster than one that has run a while: on the body, its store fills
up to the tenant's bound (``store.tenant_max_entries``, two entries a request) in
its first ~20-30 s of load, and its memos and the interpreter's heap grow with it;
``--warm-up 120`` measures both past that, as a server that has been up.

``--bypass`` sends every request to both with ``x-prefixpin-bypass: 1``: the HTTP
shell alone (front, routing, the upstream, the response), no canonicalization.

Same targets, workloads and instant upstream (nginx) as ``bench_overhead``
(``overhead/``).  A benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_overhead import recording_config
from benchmarks.overhead import nginx, roles, workloads, wrk
from benchmarks.overhead.rounds import PASSES_PER_RUN, turns
from benchmarks.overhead.targets import CLIENT_HEADERS, Target, checkout, prefixpin
from benchmarks.overhead.tools import BIN_DIR

WITHOUT = Path(__file__).resolve().parent / "without"  # its sitecustomize (--without)

CONNS = 16
SLICE_S = 1


@dataclass
class Slices:
    """One target's slices: requests, req/s, event-loop and process CPU µs per request,
    and the process's split into user and system (kernel) time."""

    target: Target
    requests: list[int] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    loop_us: list[float] = field(default_factory=list)
    process_us: list[float] = field(default_factory=list)
    user_us: list[float] = field(default_factory=list)
    system_us: list[float] = field(default_factory=list)


def run_ns(pid: int) -> tuple[int, int]:
    """(the main thread's, every thread's) time on a CPU so far, in nanoseconds."""
    main, total = 0, 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
        total += ns
        if int(tid) == pid:
            main = ns
    return main, total


def user_system_s(pid: int) -> tuple[float, float]:
    """The process's user and system CPU time so far (every thread), in seconds, to the
    kernel's clock tick (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # from the state on: utime and stime are 12th and 13th
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def measure(s: Slices, load: workloads.Workload, start: int) -> None:
    pid = s.target.procs[0].popen.pid
    main0, all0 = run_ns(pid)
    user0, system0 = user_system_s(pid)
    headers = {**CLIENT_HEADERS, **s.target.headers}
    got = wrk.run(s.target.url, load.path, conns=CONNS, duration_s=SLICE_S, start=start, headers=headers)
    main1, all1 = run_ns(pid)
    user1, system1 = user_system_s(pid)
    n = max(got.requests, 1)
    s.requests.append(got.requests)
    s.rps.append(got.rps)
    s.loop_us.append((main1 - main0) / n / 1000)
    s.process_us.append((all1 - all0) / n / 1000)
    s.user_us.append((user1 - user0) / n * 1e6)
    s.system_us.append((system1 - system0) / n * 1e6)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def ratios(a: Slices, b: Slices) -> list[tuple[str, tuple[float, float, float]]]:
    """``b`` over ``a`` slice by slice: (label, quartiles) for req/s and the CPU per request."""
    out = []
    for label, xs, ys in (
        ("req/s", b.rps, a.rps),
        ("event loop CPU per request", b.loop_us, a.loop_us),
        ("process CPU per request", b.process_us, a.process_us),
        ("process user CPU per request", b.user_us, a.user_us),
        ("process system CPU per request", b.system_us, a.system_us),
    ):
        out.append((label, quartiles([x / y for x, y in zip(xs, ys, strict=True) if y])))
    return out


def report(a: Slices, b: Slices, workload: str) -> list[str]:
    def weighted(s: Slices, us: list[float]) -> float:
        return sum(u * n for u, n in zip(us, s.requests, strict=True)) / max(sum(s.requests), 1)

    out = [f"{workload}, {CONNS} connections, {len(a.rps)} slices of {SLICE_S} s each:", ""]
    out += [
        "| target | req/s (median) | event loop CPU µs/req | process CPU µs/req | of which user | of which system |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in (a, b):
        out.append(
            f"| {s.target.name} | {statistics.median(s.rps):,.0f} | {weighted(s, s.loop_us):.1f} | "
            f"{weighted(s, s.process_us):.1f} | {weighted(s, s.user_us):.1f} | {weighted(s, s.system_us):.1f} |"
        )
    out += ["", f"{b.target.name} over {a.target.name}, slice by slice (median, interquartile range):"]
    for label, (q1, q2, q3) in ratios(a, b):
        out.append(f"- {label}: {q2:.3f}x ({q1:.3f}-{q3:.3f})")
    return out


def summary(runs: list[tuple[Slices, Slices]]) -> list[str]:
    """The runs' median ratios side by side, and their median."""
    per_run = [ratios(a, b) for a, b in runs]
    a, b = runs[0]
    out = [f"{b.target.name} over {a.target.name}, {len(runs)} runs (each run's median; the median of them):"]
    for k, (label, _) in enumerate(per_run[0]):
        medians = [r[k][1][1] for r in per_run]
        each = ", ".join(f"{m:.3f}x" for m in medians)
        out.append(f"- {label}: {each}; median {statistics.median(medians):.3f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_paired", description=__doc__.splitlines()[0])
    ap.add_argument("--compare-ref", metavar="REF", help="against git revision REF instead of recording")
    ap.add_argument("--workload", choices=("body", "mix"), default="body")
    ap.add_argument("--slices", type=int, default=50, help="one-second runs per target")
    ap.add_argument("--runs", type=int, default=1, help="times the pair is started afresh (default 1)")
    ap.add_argument("--smoke", action="store_true", help="two slices each: for CI")
    ap.add_argument(
        "--trace-path", metavar="PATH", help="where prefixpin-trace records (default: a file in the run's temp dir)"
    )
    ap.add_argument(
        "--without",
        action="append",
        type=without_spec,
        default=[],
        metavar="MODULE:NAME[=VALUE]",
        help="against itself with this function doing nothing (repeatable)",
    )
    ap.add_argument("--bypass", action="store_true", help="both sent x-prefixpin-bypass: 1 (the HTTP shell alone)")
    ap.add_argument(
        "--env",
        action="append",
        type=env_spec,
        default=[],
        metavar="NAME=VALUE",
        help="in the second prefixpin's environment (this tree's; against itself when alone) (repeatable)",
    )
    ap.add_argument(
        "--warm-up",
        type=int,
        default=3,
        metavar="SECONDS",
        help="each process serves this long before its first slice (default 3)",
    )
    args = ap.parse_args(argv)
    if args.runs < 1 or args.slices < 1 or args.warm_up < 1:
        ap.error("--runs, --slices and --warm-up: at least 1")
    if args.without and args.compare_ref:
        ap.error("--without pairs this tree with itself: not with --compare-ref")
    slices = 2 if args.smoke else args.slices
    logs = BIN_DIR / "logs-paired"
    logs.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[Slices, Slices]] = []
    with tempfile.TemporaryDirectory(prefix="prefixpin-paired-") as tmp:
        work = Path(tmp)
        load = workloads.named(work, args.workload)
        ref = checkout(args.compare_ref, work / "ref") if args.compare_ref else None
        up_proc, up = nginx.upstream(work, logs)
        try:
            for n in range(args.runs):
                check = None
                env = dict(args.env)
                if args.without:  # this tree over itself with parts switched off
                    off, check = without_env(args.without, work / f"without-{n}.txt")
                    pair = (Slices(prefixpin(up)), Slices(prefixpin(up, name="prefixpin-without", env={**env, **off})))
                elif ref is not None:  # this tree over the revision
                    pair = (
                        Slices(prefixpin(up, name=f"prefixpin@{args.compare_ref}", source=ref)),
                        Slices(prefixpin(up, env=env or None)),
                    )
                elif env:  # this tree over itself in another environment
                    pair = (Slices(prefixpin(up)), Slices(prefixpin(up, name="prefixpin-env", env=env)))
                else:  # recording over not
                    config = recording_config(work, args.trace_path)
                    pair = (Slices(prefixpin(up)), Slices(prefixpin(up, name="prefixpin-trace", config=config)))
                if args.bypass:
                    for s in pair:
                        s.target.headers["x-prefixpin-bypass"] = "1"
                warm_s = 1 if args.smoke else args.warm_up
                if not one_run(pair, load, logs, slices, warm_s=warm_s, check=check):
                    return 1
                runs.append(pair)
                if args.runs > 1:
                    print("\n".join(["", f"run {n + 1} of {args.runs}:", *report(*pair, args.workload)]), flush=True)
        finally:
            up_proc.stop()
    if args.without:
        print("prefixpin-without: prefixpin where these do nothing: " + ", ".join(_said(w) for w in args.without))
    if args.env:
        print("the second prefixpin's environment: " + " ".join(f"{k}={v}" for k, v in args.env))
    if args.runs == 1:
        print("\n".join(report(*runs[0], args.workload)))
    else:
        print("\n".join(["", *summary(runs)]))
    return 0


Without = tuple[str, str, object]  # module, qualified name, the value it returns
WARM_RATE = 20_000  # request numbers a second of warm-up may use, at most (prefixpin serves ~1,000-7,000)


def without_spec(text: str) -> Without:
    """``--without``'s ``MODULE:NAME[=VALUE]``."""
    where, eq, value = text.partition("=")
    module, colon, name = where.partition(":")
    if not colon or not module or not name:
        raise argparse.ArgumentTypeError(f"MODULE:NAME[=VALUE], e.g. proxy.addons.measure:Measure.done (got {text!r})")
    try:
        returned = ast.literal_eval(value) if eq else None
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Python literal") from None
    return module, name, returned


def env_spec(text: str) -> tuple[str, str]:
    """``--env``'s ``NAME=VALUE``."""
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"NAME=VALUE, e.g. PYTHONMALLOC=malloc (got {text!r})")
    return name, value


def _said(w: Without) -> str:
    return f"{w[0]}:{w[1]}" + (f" (returns {w[2]!r})" if w[2] is not None else "")


Check = Callable[[tuple[Slices, Slices]], str | None]  # once both are up: what is wrong, or None


def without_env(without: list[Without], done: Path) -> tuple[dict[str, str], Check]:
    """The environment of the process with ``without`` switched off, and the check that
    it was: every name replaced (``without/sitecustomize.py`` lists them in ``done``)."""
    env = {
        "PYTHONPATH": str(WITHOUT),
        "PREFIXPIN_WITHOUT": json.dumps([list(w) for w in without]),
        "PREFIXPIN_WITHOUT_DONE": str(done),
    }

    def check(pair: tuple[Slices, Slices]) -> str | None:
        wanted = sorted(f"{m}:{n}" for m, n, _ in without)
        if not done.exists():
            return f"prefixpin-without did not import every module of {wanted}: nothing replaced"
        listed = sorted(done.read_text(encoding="utf-8").split())
        if listed != wanted:
            return f"prefixpin-without replaced {listed}, not {wanted} (a name not there is !module:name)"
        return None

    return env, check


def one_run(
    pair: tuple[Slices, Slices],
    load: workloads.Workload,
    logs: Path,
    slices: int,
    *,
    warm_s: int,
    check: Check | None = None,
) -> bool:
    """The pair started, warmed up (``warm_s`` each), measured ``slices`` times each in turns, stopped;
    False (said why) when a target cannot start, or ``check`` (called once both are
    up, before the warm-up) says what is wrong with them."""
    try:
        for s in pair:
            s.target.start(logs)
            if s.target.reason:
                print(f"{s.target.name} unavailable: {s.target.reason}", file=sys.stderr)
                return False
        wrong = check(pair) if check is not None else None
        if wrong:
            print(wrong, file=sys.stderr)
            return False
        stretch = PASSES_PER_RUN * len(load.templates)  # request numbers per run: each starts at turn 0
        # Each warm-up on request numbers no slice (nor the other's warm-up) uses: past the
        # slices', a span of stretches wide enough for WARM_RATE requests a second.
        first = len(pair) * (slices + 1) + 1
        span = 1 + warm_s * WARM_RATE // stretch
        for n, s in enumerate(pair):
            roles.warm_up(s.target, load, conns=CONNS, start=(first + n * span) * stretch, seconds=warm_s)
        run = len(pair)
        for i in range(slices):
            for s in turns(list(pair), i):
                run += 1
                measure(s, load, run * stretch)
    finally:
        for s in pair:
            s.target.stop()
    return True


if __name__ == "__main__":
    sys.exit(main())
