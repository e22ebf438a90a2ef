"""The overhead benchmark's workloads in process: prefixpin's request path without sockets.

    python -m benchmarks.bench_inprocess                  # CPU µs per request, body and mix
    python -m benchmarks.bench_inprocess --profile mix    # and where the mix's time goes (cProfile)
    python -m benchmarks.bench_inprocess --evict 0,2,8,32 # the same with N MiB of other memory written between requests
    python -m benchmarks.bench_inprocess --evict 0,2 --compare-ref f56259b   # and revision f56259b, the same way
    python -m benchmarks.bench_inprocess --evict 0 --rounds 8 --compare-ref f56259b --compare-ref 7e54566  # in turns
    python -m benchmarks.bench_inprocess --stages         # and how much of it each step of the request takes
    python -m benchmarks.bench_inprocess --gc --requests 20000   # the cyclic collector's pauses meanwhile

Sends the same requests as ``bench_overhead`` (``overhead/workloads.py``, in wrk's
order) through the core as the proxy drives it, the splice and the record
(``proxy.offline``: the request machine on an embedded store, one tenant), each
answered with the instant upstream's reply.  The first quarter warms the memos and the
store up; the rest is timed by this thread's CPU time, so other jobs on a shared
machine do not count.  What is left between this and ``bench_overhead``'s CPU
per request is the HTTP shell, the addons, the sockets and the cold caches of a
live server.

``--evict`` measures that last part: between two requests (untimed) it writes N MiB of
other memory, as a live server's other work does (its sockets' buffers, the other
connections' requests), and hands the request its body freshly copied, as a socket
read does; each request is then timed alone.  The CPU it takes on top of ``0`` is
time spent waiting on memory the request needs (the core's code and its kept objects)
that the other work pushed out of the caches.

With ``--compare-ref REF`` each workload goes through this tree and through
revision REF (``git archive`` exported), each in a process of its own running the
same loop (:mod:`benchmarks.inprocess_ref`, which needs of a tree only
``proxy.offline``): what the two request paths cost cold and warm, side by side,
without a live server's noise.  ``--compare-ref`` may be given several times (a
revision per row: where along the history a cost came).  One process's figure
moves by up to ~8% from one process to the next here (another hash seed and memory
layout, the host's drift), as much as a difference worth finding; ``--rounds N``
measures every tree N times, in turns (the order reversed every other round, so a
drift weighs on all alike), and reports each tree's median.

``--stages`` splits the same CPU time by the request's steps and roles
(:data:`STAGES`): the body parsed by pieces, the analysis (and the part of it that
reads a changed system text again), the store's lookup and record, the decision's
finalizing, the edits spliced, the record's turn built; the rest is the machine's
other steps (classification, the needs answered) and the request's set-up.  Each
step is timed by this thread's CPU time around its call: two reads of that clock per
step, each a system call, so a request's "all" is ~10-15 µs above the untimed run's.

The cyclic garbage collector is tuned as ``prefixpin serve`` tunes it
(:func:`proxy.cli.serve.tune_gc`), so its collections weigh as they do live.
``--gc`` counts them while each workload runs from an empty store (all its requests
timed, none warm-up): how many of each generation, the longest (the event loop does
nothing else meanwhile), their time per request, and the objects the collector
tracks at the end (what the next collection of the oldest generation walks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import gc
import inspect
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import canonicalize.analysis
import canonicalize.bodies
import canonicalize.finalize
import proxy.drive
import proxy.offline
from benchmarks import inprocess_ref
from benchmarks.overhead import mix, workloads
from benchmarks.overhead.targets import CLIENT_HEADERS, checkout
from canonicalize.bodies import Bodies
from proxy.cli.serve import tune_gc
from proxy.config import load
from proxy.offline import Offline
from proxy.store.memory import MemoryStore
from tests.infra.procs import REPO

REPLY = {"role": "assistant", "content": mix.REPLY}
MAX_EVICT_MIB = 4096  # --evict holds twice this much memory while it runs

# --stages: (label, owner, attribute) of each step timed; an async one is timed across its
# await.  A label starting with "  of which" is part of the step above it (not in "the rest").
STAGES = (
    ("parse", Bodies, "parse"),
    ("  of which finding the conversation (a skim of its first two items, hashed)", canonicalize.bodies, "lead"),
    ("  of which the pieces reused and the gaps parsed", canonicalize.bodies, "reuse"),
    ("analysis", canonicalize.analysis, "prepare"),
    ("  of which the system texts", canonicalize.analysis, "_system_pass"),
    ("    of which a changed system text read again", canonicalize.analysis, "rescan"),
    ("  of which the history's links", canonicalize.analysis, "_chain"),
    ("store lookup", MemoryStore, "lookup"),
    ("finalize", canonicalize.finalize, "finalize"),
    ("  of which the pinned values put back", canonicalize.finalize, "_restore"),
    ("splice", proxy.offline, "render"),
    ("turn", proxy.drive, "turn"),
    ("store record", MemoryStore, "record"),
)


def loads(work: Path, conversations: int, turns: int) -> dict[str, workloads.Workload]:
    """The two workloads, their files written under ``work``: body, and a mix of ``conversations``."""
    return {
        "body": workloads.repeated(work),
        "mix": workloads.conversations(work, conversations, turns),
    }


async def run(
    w: workloads.Workload,
    count: int,
    profile: cProfile.Profile | None = None,
    evict_mib: float | None = None,
    each: Callable[[str | None], None] | None = None,
) -> tuple[float, Counter[str]]:
    """(CPU µs per timed request, their roles): ``count`` requests, the first quarter
    untimed; ``evict_mib``: MiB written between requests (module docstring);
    ``each``: called once the untimed ones are done (None), then after each timed
    one (its role)."""
    offline = Offline(load(None, env={}))
    headers = {k.lower(): v for k, v in CLIENT_HEADERS.items()}
    bodies = [w.render(n).encode() for n in range(count)]
    warm = count // 4
    for raw in bodies[:warm]:
        await offline.send(raw, headers=headers, reply=REPLY)
    roles: Counter[str] = Counter()
    if each is not None:
        each(None)
    if evict_mib is not None:
        return await inprocess_ref.timed(offline, bodies[warm:], headers, REPLY, int(evict_mib * (1 << 20))), roles
    if profile is not None:
        profile.enable()
    t0 = time.thread_time()
    for raw in bodies[warm:]:
        flow = await offline.send(raw, headers=headers, reply=REPLY)
        roles[flow.role] += 1
        if each is not None:
            each(flow.role)
    spent = time.thread_time() - t0
    if profile is not None:
        profile.disable()
    return 1e6 * spent / (count - warm), roles


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_inprocess", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2048, help="requests per workload (a quarter of them warm-up)")
    ap.add_argument("--conversations", type=int, default=64, help="mix: conversations in flight")
    ap.add_argument("--turns", type=int, default=8, help="mix: turns per conversation")
    ap.add_argument("--profile", choices=("body", "mix"), help="also profile this workload (cProfile, CPU time)")
    ap.add_argument(
        "--evict", metavar="MIB,...", type=mib_list, help="instead: MiB written between requests, one column each"
    )
    ap.add_argument(
        "--compare-ref",
        metavar="REF",
        action="append",
        help="with --evict: also git revision REF (each tree through benchmarks/inprocess_ref.py, a process each); "
        "repeatable",
    )
    ap.add_argument(
        "--rounds",
        type=positive,
        default=1,
        help="with --compare-ref: each tree measured this many times, in turns; the median reported",
    )
    ap.add_argument("--stages", action="store_true", help="instead: CPU µs per request in each step of it")
    ap.add_argument("--gc", action="store_true", help="instead: the cyclic collector's collections and pauses")
    args = ap.parse_args(argv)
    if args.compare_ref and not args.evict:
        ap.error("--compare-ref goes with --evict")
    if args.rounds > 1 and not args.compare_ref:
        ap.error("--rounds goes with --compare-ref")
    tune_gc()
    if args.gc:
        return _gc_table(args)
    if args.evict:
        return _evict_table(args)
    if args.stages:
        return _stages_table(args)
    with tempfile.TemporaryDirectory(prefix="prefixpin-inprocess-") as tmp:
        named = loads(Path(tmp), args.conversations, args.turns)
        print("| workload | CPU µs per request | roles |")
        print("|---|---:|---|")
        for name, w in named.items():
            us, roles = asyncio.run(run(w, args.requests))
            print(f"| {name} | {us:,.0f} | {', '.join(f'{k} {v}' for k, v in roles.most_common())} |")
        if args.profile:
            profile = cProfile.Profile(time.thread_time)
            asyncio.run(run(named[args.profile], args.requests, profile))
            print(f"\n{args.profile}, by cumulative CPU time (cProfile roughly doubles it):\n", file=sys.stdout)
            pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    return 0


def mib_list(text: str) -> list[float]:
    """``--evict``'s value: comma-separated MiB, each from 0 to 4096 (argparse names a bad one)."""
    try:
        sizes = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of MiB") from None
    if any(not 0 <= mib <= MAX_EVICT_MIB for mib in sizes):
        raise argparse.ArgumentTypeError(f"each amount must be from 0 to {MAX_EVICT_MIB} MiB, got {text!r}")
    return sizes


def positive(text: str) -> int:
    """``--rounds``: a whole number from 1 on (argparse names a bad one)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def _gc_table(args: argparse.Namespace) -> int:
    """``--gc``: the collector's work while each workload's requests go through."""
    with tempfile.TemporaryDirectory(prefix="prefixpin-inprocess-") as tmp:
        named = loads(Path(tmp), args.conversations, args.turns)
        print(
            "| workload | requests | collections of generation 0 / 1 / 2 | longest ms "
            "| collector µs per request | objects tracked at the end |"
        )
        print("|---|---:|---|---:|---:|---:|")
        for name, w in named.items():
            counts, pauses, tracked = asyncio.run(_collecting(w, args.requests))
            longest = max(pauses, default=0.0) * 1e3
            per = 1e6 * sum(pauses) / args.requests
            gens = " / ".join(str(c) for c in counts)
            print(f"| {name} | {args.requests:,} | {gens} | {longest:.1f} | {per:.1f} | {tracked:,} |")
    return 0


async def _collecting(w: workloads.Workload, count: int) -> tuple[list[int], list[float], int]:
    """(collections per generation, each one's seconds, objects tracked at the end) of
    ``count`` requests of ``w`` from an empty store, each body made as it is sent."""
    offline = Offline(load(None, env={}))
    headers = {k.lower(): v for k, v in CLIENT_HEADERS.items()}
    counts, pauses, started = [0, 0, 0], [], [0.0]

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counts[info["generation"]] += 1
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(note)
    try:
        for n in range(count):
            await offline.send(w.render(n).encode(), headers=headers, reply=REPLY)
    finally:
        gc.callbacks.remove(note)
    return counts, pauses, len(gc.get_objects())


def _stages_table(args: argparse.Namespace) -> int:
    """``--stages``: CPU µs per request in each of :data:`STAGES`, by workload and role."""
    spent: dict[str, float] = {}
    columns: dict[str, defaultdict[str, float]] = {}  # "workload role": CPU s by step, "all"; "requests"
    with tempfile.TemporaryDirectory(prefix="prefixpin-inprocess-") as tmp, _timed(spent):
        for name, w in loads(Path(tmp), args.conversations, args.turns).items():
            asyncio.run(run(w, args.requests, each=_by_role(name, spent, columns)))
    print("| step | " + " | ".join(f"{key} ({int(c['requests'])}) µs" for key, c in columns.items()) + " |")
    print("|---|" + "---:|" * len(columns))
    for label in [*(label for label, _, _ in STAGES), "the rest", "all"]:
        cells = []
        for c in columns.values():
            steps = sum(c[lb] for lb, _, _ in STAGES if not lb.startswith(" "))
            value = c["all"] - steps if label == "the rest" else c[label]
            cells.append(f"{1e6 * value / c['requests']:,.1f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


def _by_role(
    name: str, spent: dict[str, float], columns: dict[str, defaultdict[str, float]]
) -> Callable[[str | None], None]:
    """``run``'s ``each`` for workload ``name``: what each timed request spent, added to
    its role's column (``columns``), with its CPU in all since the previous one."""
    last = time.thread_time()

    def each(role: str | None) -> None:
        nonlocal last
        now = time.thread_time()
        if role is not None:
            column = columns.setdefault(f"{name} {role}", defaultdict(float))
            for label, seconds in spent.items():
                column[label] += seconds
            column["all"] += now - last
            column["requests"] += 1
        spent.clear()
        last = time.thread_time()

    return each


@contextlib.contextmanager
def _timed(spent: dict[str, float]) -> Iterator[None]:
    """Each of :data:`STAGES` timed into ``spent`` (CPU seconds by label) while inside;
    put back after."""
    saved = [(owner, attr, getattr(owner, attr)) for _, owner, attr in STAGES]
    try:
        for (label, owner, attr), (_, _, fn) in zip(STAGES, saved, strict=True):
            setattr(owner, attr, _timer(label, fn, spent))
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def _timer(label: str, fn: Any, spent: dict[str, float]) -> Any:
    """``fn`` timed into ``spent[label]`` (across its await when it is a coroutine function)."""
    clock = time.thread_time
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + clock() - t0

        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + clock() - t0

    return timed


def _evict_table(args: argparse.Namespace) -> int:
    """``--evict``: CPU µs per request of each workload, one column per amount; with
    ``--compare-ref``, each workload through this tree and through each revision, each
    in a process of its own running the same loop (:mod:`benchmarks.inprocess_ref`),
    ``--rounds`` times in turns, the median reported."""
    sizes: list[float] = args.evict
    refs: list[str] = args.compare_ref or []
    with tempfile.TemporaryDirectory(prefix="prefixpin-inprocess-") as tmp:
        work = Path(tmp)
        named = loads(work, args.conversations, args.turns)
        trees = {"": REPO}
        for n, ref in enumerate(refs):
            trees.setdefault(f"@{ref}", checkout(ref, work / f"ref{n}"))
        rounds = f", median of {args.rounds} rounds" if args.rounds > 1 else ""
        print(f"| workload{rounds} | " + " | ".join(f"{mib:g} MiB written between requests" for mib in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for name, w in named.items():
            if refs:
                rows = _in_turns(trees, w, args.requests, sizes, args.rounds, work / f"{name}.json")
            else:
                rows = {"": [asyncio.run(run(w, args.requests, evict_mib=mib))[0] for mib in sizes]}
            for suffix, cells in rows.items():
                print(f"| {name}{suffix} | " + " | ".join(f"{us:,.0f}" for us in cells) + " |")
    return 0


def _in_turns(
    trees: dict[str, Path], w: workloads.Workload, count: int, sizes: list[float], rounds: int, job: Path
) -> dict[str, list[float]]:
    """Each tree's median µs per request for each of ``sizes`` over ``rounds`` rounds, the
    trees taking turns (in reverse order every other round)."""
    found: dict[str, list[list[float]]] = {suffix: [] for suffix in trees}
    order = list(trees)
    for n in range(rounds):
        for suffix in order if n % 2 == 0 else order[::-1]:
            found[suffix].append(_in_process_of(trees[suffix], w, count, sizes, job))
    return {suffix: [statistics.median(col) for col in zip(*runs, strict=True)] for suffix, runs in found.items()}


def _in_process_of(tree: Path, w: workloads.Workload, count: int, sizes: list[float], job: Path) -> list[float]:
    """``w``'s µs per request through ``tree``'s request path, for each of ``sizes``, in a
    process of its own (:mod:`benchmarks.inprocess_ref`); the job file ``job`` written
    once, read by every tree."""
    if not job.exists():
        _write_job(job, w, count, sizes)
    done = subprocess.run(
        # (-P: the driver's own directory, benchmarks/, is not put on sys.path: its http/ would hide the stdlib's)
        [sys.executable, "-P", str(Path(inprocess_ref.__file__)), str(job)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the request path failed:\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return [found[f"{mib:g}"] for mib in sizes]


def _write_job(job: Path, w: workloads.Workload, count: int, sizes: list[float]) -> None:
    """The job :mod:`benchmarks.inprocess_ref` reads: ``w``'s first ``count`` bodies (a
    quarter warm-up), the headers, the reply, the collector's thresholds, the amounts."""
    job.write_text(
        json.dumps(
            {
                "bodies": [w.render(n) for n in range(count)],
                "warm": count // 4,
                "headers": {k.lower(): v for k, v in CLIENT_HEADERS.items()},
                "reply": REPLY,
                "gc_threshold": gc.get_threshold(),  # prefixpin serve's (tune_gc), frozen first there too
                "evict_mib": sizes,
            }
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    raise SystemExit(main())
