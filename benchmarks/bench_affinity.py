"""Affinity benchmark (SPEC 2c): serve each lineage where its prefix is cached.

Every contender gets fresh real ``llama-server`` processes (llama.cpp's default slot
similarity, the tiny GGUF of bench_cache) and the seeded hermes traces of
:mod:`benchmarks.traces`; three client threads ("users", see :class:`Pace`) send the
sessions concurrently, each one session at a time with think time between requests,
so sessions contend for slots and replicas.  Two llama-server setups:

- ``fixed``: ``--parallel 3 --cache-ram 0``: each slot its own KV, no RAM prompt cache
  (the slot is the cache; where sessions thrash each other's slots);
- ``defaults``: as users start it: ``--parallel`` auto (4 slots on one unified KV
  pool), the 8 GiB RAM prompt cache; ``-c`` twice the trace's largest request.

(a) one llama-server: the *ideal* trace sent directly vs the *pre-fix* trace through
    ``prefixpin serve`` with ``affinity.llama_slots: 3`` (fixed), and, with one request
    in flight at a time (``-serial``), on both setups: the pre-fix trace direct, through
    prefixpin without ``llama_slots``, with N (3 fixed, 4 defaults) and with ``auto``.
    Goals: with fixed slots, pinning 10+ points above the ideal-direct ratio; on the
    defaults, ``llama_slots`` (N or auto) >= 98% of prefixpin without it.
(b) two replicas (fixed): prefixpin with ``upstream.pool`` and ``affinity.replicas``
    ``round_robin`` vs ``lineage`` (both with ``llama_slots: 3``), and SGLang's
    cache-aware router (``sglang-router`` from PyPI, when it installs) on the same
    pre-fix trace and on the ideal one.
(c) two replicas (fixed), lineage affinity, one replica SIGKILLed once a share of the
    requests is done: requests lost at the client and the cached ratio after the kill.
(d) three sessions (one per user, interleaved, one request at a time) on the defaults
    setup, prefixpin without ``llama_slots``: one upstream vs a pool of two (lineage),
    and the pool with a replica SIGKILLed mid-run.  Goals: both replicas serve >= 20%
    of the requests, cached >= 98% of one upstream's, nothing lost.

The client is :func:`proxy.cli.replay.send`, tried as the OpenAI SDKs do (a request
that got no response, or a 429/502/503/504, is sent again, three tries in all);
first-try failures are counted apart from lost requests (failed after every try).
Exit code 1 when a goal is missed or a request was lost (``--smoke``: only when a
request was lost that was not in flight on the killed replica).

    python -m benchmarks.bench_affinity            # every contender (long on 2 cores)
    python -m benchmarks.bench_affinity --smoke    # ~75 s: (a) concurrent, (b) prefixpin, (c) (CI)
    python -m benchmarks.bench_affinity --only a-defaults-prefixpin-serial,a-defaults-prefixpin-slots-serial
    python -m benchmarks.bench_affinity --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.bench_cache import LLAMA_METRICS, _git_state, _labelled, _metric_sums, _pct
from benchmarks.traces import TraceSpec, work_dirs, write_pair
from proxy.cli.replay import ATTEMPTS, Result, Totals, send
from proxy.cli.trace import TraceLine, read_trace
from tests.infra import router
from tests.infra.procs import Proc, start_llama, start_prefixpin

SLOTS = 3  # llama-server --parallel (fixed), affinity.llama_slots there, client threads
DEFAULT_SLOTS = 4  # what llama-server's --parallel auto gives; affinity.llama_slots: N on the defaults
CTX_PER_SLOT = 16384
MODEL = {"layers": 4, "embd": 256}  # bench_cache's tiny GGUF
GOAL_POINTS = 0.10  # (a, fixed): prefixpin's cached ratio above the ideal-direct one
GOAL_RATIO = 0.98  # (a, defaults): llama_slots vs none; (d): a pool of two vs one upstream
GOAL_SHARE = 0.20  # (d): each replica's share of the requests
KILL_AT = 0.4  # (c), (d): share of the requests done when a replica is killed
FULL = TraceSpec(sessions=6, turns=4, fork_every=2, seed=7)  # 2 sessions per user
THREE = TraceSpec(sessions=3, turns=6, fork_every=2, seed=7)  # (d): 1 session per user
SMOKE = TraceSpec(sessions=3, turns=2, fork_every=2, seed=7)
SETUPS: dict[str, dict[str, Any]] = {
    "fixed": {"parallel": SLOTS, "cache_ram": 0, "ctx": SLOTS * CTX_PER_SLOT},
    "defaults": {"parallel": None, "cache_ram": None},  # -c: twice the trace's largest request
}


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    part: str  # a | b | c | d
    trace: str  # prefix | ideal
    front: str  # direct | prefixpin | router
    replicas: int = 1
    policy: str | None = None  # affinity.replicas (prefixpin with a pool)
    kill: bool = False
    serial: bool = False  # one request in flight at a time (the users' sessions still interleave)
    setup: str = "fixed"  # llama-server's setup (SETUPS)
    slots: int | str = SLOTS  # affinity.llama_slots (prefixpin); 0: off
    smoke: bool = False  # part of --smoke

    def config(self) -> dict[str, Any]:
        affinity: dict[str, Any] = {"llama_slots": self.slots} if self.slots else {}
        if self.policy:
            affinity["replicas"] = self.policy
        return {"affinity": affinity}

    @property
    def spec(self) -> str:
        return "three" if self.part == "d" else "main"


def _serial(prefix: str, setup: str, n: int) -> tuple[Contender, ...]:
    """(a) one request at a time on ``setup``: ideal and pre-fix direct, prefixpin
    without llama_slots, with ``n`` and with auto."""
    return (
        Contender(f"{prefix}ideal-direct-serial", "a", "ideal", "direct", serial=True, setup=setup),
        Contender(f"{prefix}prefix-direct-serial", "a", "prefix", "direct", serial=True, setup=setup),
        Contender(f"{prefix}prefixpin-serial", "a", "prefix", "prefixpin", serial=True, setup=setup, slots=0),
        Contender(f"{prefix}prefixpin-slots-serial", "a", "prefix", "prefixpin", serial=True, setup=setup, slots=n),
        Contender(
            f"{prefix}prefixpin-slots-auto-serial", "a", "prefix", "prefixpin", serial=True, setup=setup, slots="auto"
        ),
    )


CONTENDERS = (
    Contender("a-ideal-direct", "a", "ideal", "direct", smoke=True),
    Contender("a-prefixpin-slots", "a", "prefix", "prefixpin", smoke=True),
    *_serial("a-", "fixed", SLOTS),
    *_serial("a-defaults-", "defaults", DEFAULT_SLOTS),
    Contender("b-round-robin", "b", "prefix", "prefixpin", 2, "round_robin", smoke=True),
    Contender("b-lineage", "b", "prefix", "prefixpin", 2, "lineage", smoke=True),
    Contender("b-router-cache-aware", "b", "prefix", "router", 2),
    Contender("b-router-cache-aware-ideal", "b", "ideal", "router", 2),
    Contender("c-lineage-kill", "c", "prefix", "prefixpin", 2, "lineage", kill=True, smoke=True),
    Contender("d-one-upstream", "d", "prefix", "prefixpin", serial=True, setup="defaults", slots=0),
    Contender("d-pool-lineage", "d", "prefix", "prefixpin", 2, "lineage", serial=True, setup="defaults", slots=0),
    Contender(
        "d-pool-lineage-kill",
        "d",
        "prefix",
        "prefixpin",
        2,
        "lineage",
        kill=True,
        serial=True,
        setup="defaults",
        slots=0,
    ),
)


@dataclass(frozen=True, slots=True)
class Pace:
    """How sessions overlap: ``users`` client threads (one per llama slot), each running
    its sessions one after another, ``gap_s`` apart; user k starts ``k * stagger_s`` in.
    After each response a user waits the trace's gap to the session's next request
    times ``time_scale`` (the agent's tool run, its user's think time), so the other
    sessions' slots sit idle, holding their caches, while a new session starts."""

    users: int = SLOTS
    stagger_s: float = 2.0
    gap_s: float = 4.0
    time_scale: float = 0.05


@dataclass(slots=True)
class Sent:
    """One request as the client saw it, with when it started (monotonic)."""

    result: Result
    started: float


# -- the clients ----------------------------------------------------------------------
def _sessions(lines: list[TraceLine]) -> list[list[TraceLine]]:
    by: dict[str, list[TraceLine]] = {}
    for line in lines:
        by.setdefault(line.session or "-", []).append(line)
    return list(by.values())


class Killer:
    """Once ``at`` requests are done, SIGKILL the replica that answered the most so far."""

    def __init__(self, at: int, llamas: list[Proc]) -> None:
        self.at, self.llamas = at, llamas
        self.done: Counter[str] = Counter()
        self.killed: int | None = None
        self.when: float | None = None
        self.in_flight = 0
        self.in_flight_at_kill = 0
        self.lock = threading.Lock()

    def started(self) -> None:
        with self.lock:
            self.in_flight += 1

    def finished(self, r: Result, now: float) -> None:
        with self.lock:
            self.in_flight -= 1
            if r.replica is not None:
                self.done[r.replica] += 1
            if self.killed is None and sum(self.done.values()) >= self.at:
                self.killed = int(self.done.most_common(1)[0][0])
                self.when = now
                self.in_flight_at_kill = self.in_flight
                self.llamas[self.killed].stop(signal.SIGKILL)


def drive(base: str, lines: list[TraceLine], pace: Pace, killer: Killer | None, *, serial: bool) -> list[Sent]:
    """Send every session as :class:`Pace` says; each session's requests in order
    (``serial``: one request in flight at a time)."""
    sessions = _sessions(lines)
    out: list[Sent] = []
    lock = threading.Lock()
    gate: threading.Lock | contextlib.nullcontext[None] = threading.Lock() if serial else contextlib.nullcontext()
    t0 = time.monotonic()

    def user(k: int) -> None:
        time.sleep(k * pace.stagger_s)
        with httpx.Client(timeout=httpx.Timeout(600), trust_env=False) as client:
            for n, todo in enumerate(sessions[k :: pace.users]):
                if n:
                    time.sleep(pace.gap_s)
                for i, line in enumerate(todo):
                    if i:
                        time.sleep((line.t - todo[i - 1].t) * pace.time_scale)
                    started = time.monotonic() - t0
                    if killer:
                        killer.started()
                    with gate:
                        r = send(client, base, line, None, attempts=ATTEMPTS)
                    if killer:
                        killer.finished(r, time.monotonic() - t0)
                    with lock:
                        out.append(Sent(r, started))

    threads = [threading.Thread(target=user, args=(k,), name=f"user-{k}") for k in range(pace.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.sort(key=lambda s: s.result.line)
    return out


# -- one contender ----------------------------------------------------------------------
def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=10, trust_env=False)


def llama_args(setup: str, trace: list[TraceLine]) -> dict[str, Any]:
    """start_llama's arguments for ``setup``; the defaults' ``-c``: twice the trace's
    largest request (a token per byte of its JSON body, a little over the prompt)."""
    args = {**MODEL, **SETUPS[setup]}
    if "ctx" not in args:
        largest = max(len(json.dumps(line.body, ensure_ascii=False).encode()) for line in trace)
        args["ctx"] = 2 * largest // 1024 * 1024 + 1024
    return args


def run_one(c: Contender, trace: list[TraceLine], log_dir: Path, pace: Pace) -> dict[str, Any]:
    procs: list[Proc] = []
    llamas: list[Proc] = []
    bases: list[str] = []
    try:
        for i in range(c.replicas):
            proc, base = start_llama(
                log_dir,
                threads=2 // c.replicas or 1,  # the machine's 2 cores, shared by the replicas
                name=f"llama-{c.name}-{i}",
                **llama_args(c.setup, trace),
            )
            procs.append(proc)
            llamas.append(proc)
            bases.append(base)
        if c.front == "direct":
            front = bases[0]
        elif c.front == "router":
            proc, front = router.start(log_dir, bases, name=f"router-{c.name}")
            procs.append(proc)
        else:
            cfg = c.config()
            if c.replicas > 1:
                cfg["upstream"] = {"pool": bases}
            path = log_dir / f"{c.name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            proc, front = start_prefixpin(log_dir, upstream=bases[0], config=path, name=f"prefixpin-{c.name}")
            procs.append(proc)
        killer = Killer(max(1, int(KILL_AT * len(trace))), llamas) if c.kill else None
        t0 = time.perf_counter()
        sent = drive(front, trace, pace, killer, serial=c.serial)
        elapsed = time.perf_counter() - t0
        llama = [
            _metric_sums(_get(b + "/metrics").text, LLAMA_METRICS) if p.alive() else None
            for b, p in zip(bases, llamas, strict=True)
        ]
        extra: dict[str, Any] = {}
        if c.front == "prefixpin":
            text = _get(front + "/metrics").text
            extra = {
                "replica_requests_total": _labelled(text, "prefixpin_replica_requests_total"),
                "replica_failovers_total": _metric_sums(text, ("prefixpin_replica_failovers_total",))[
                    "prefixpin_replica_failovers_total"
                ],
                "fail_open_total": _labelled(text, "prefixpin_fail_open_total"),
                "llama_slots": _get(front + "/readyz").json().get("llama_slots"),
            }
            if killer:
                ready = _get(front + "/readyz")
                extra["readyz"] = {"status": ready.status_code, "body": ready.json()}
    finally:
        for proc in reversed(procs):
            proc.stop()
    out = summarize(c, sent, elapsed, llama, extra, killer)
    out["llama_args"] = llama_args(c.setup, trace)
    return out


def _totals(sent: list[Sent]) -> Totals:
    t = Totals()
    for s in sent:
        t.add(s.result)
    return t


def _ratio(t: Totals) -> float | None:
    return t.ratio


def _replicas_per_session(sent: list[Sent]) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for s in sent:
        by.setdefault(s.result.session or "-", []).append(s.result.replica or "-")
    return by


def summarize(
    c: Contender,
    sent: list[Sent],
    elapsed: float,
    llama: list[dict[str, float] | None],
    extra: dict[str, Any],
    killer: Killer | None,
) -> dict[str, Any]:
    total = _totals(sent)
    forks = _totals([s for s in sent if s.result.kind == "fork"])
    lost = [s for s in sent if not s.result.ok]
    per_session = _replicas_per_session(sent)
    out: dict[str, Any] = {
        "run": c.name,
        "part": c.part,
        "setup": c.setup,
        "trace": c.trace,
        "front": c.front,
        "replicas": c.replicas,
        "policy": c.policy,
        "llama_slots": c.slots if c.front == "prefixpin" else None,
        "serial": c.serial,
        "requests": total.requests,
        "lost": len(lost),
        "first_try_failures": total.retried,
        "prompt_tokens": total.prompt,
        "cached_tokens": total.cached,
        "processed_tokens": total.processed,
        "cached_ratio": _ratio(total),
        "fork_cached_ratio": _ratio(forks),
        "request_wall_s": round(total.wall_s, 3),
        "run_wall_s": round(elapsed, 3),
        "llama": llama,
        "prefixpin": extra,
        "sessions_on_one_replica": (
            sum(len(set(v)) == 1 for v in per_session.values()) if c.front == "prefixpin" else None
        ),
        "sessions": len(per_session),
        "requests_per_replica": dict(sorted(Counter(s.result.replica or "-" for s in sent).items())),
        "roles": dict(Counter(s.result.role or "-" for s in sent)),
        "errors": sorted({(s.result.error or "")[:200] for s in lost}),
        "retried_errors": sorted({e[:200] for s in sent for e in s.result.retried}),
    }
    if killer is not None and killer.when is not None:
        after = [s for s in sent if s.started >= killer.when]
        before = [s for s in sent if s.started < killer.when]
        moved = 0
        for s in per_session.values():
            k = str(killer.killed)
            moved += k in s and s[-1] != k
        out["kill"] = {
            "replica": killer.killed,
            "after_requests_done": killer.at,
            "in_flight_at_kill": killer.in_flight_at_kill,
            "lost_sent_before_kill": sum(not s.result.ok for s in before),
            "lost_sent_after_kill": sum(not s.result.ok for s in after),
            "requests_after_kill": len(after),
            "cached_ratio_before_kill": _ratio(_totals(before)),
            "cached_ratio_after_kill": _ratio(_totals(after)),
            "sessions_moved_off_killed_replica": moved,
        }
    return out


# -- comparison and report ------------------------------------------------------------------
def compare(runs: dict[str, dict[str, Any]], skipped: dict[str, str], smoke: bool) -> dict[str, Any]:
    def ratio(name: str) -> float | None:
        r = runs.get(name)
        return r["cached_ratio"] if r else None

    def points(ideal: str, pinned: str) -> float | None:
        a, b = ratio(ideal), ratio(pinned)
        return None if a is None or b is None else b - a

    def relative(name: str, base: str) -> float | None:
        a, b = ratio(name), ratio(base)
        return None if a is None or not b else a / b

    rr, lin = ratio("b-round-robin"), ratio("b-lineage")
    concurrent = points("a-ideal-direct", "a-prefixpin-slots")
    serial = points("a-ideal-direct-serial", "a-prefixpin-slots-serial")
    serial_auto = points("a-ideal-direct-serial", "a-prefixpin-slots-auto-serial")
    defaults = {
        n: relative(f"a-defaults-prefixpin-{n}-serial", "a-defaults-prefixpin-serial") for n in ("slots", "slots-auto")
    }
    pool = relative("d-pool-lineage", "d-one-upstream")
    shares = _shares(runs.get("d-pool-lineage"))
    kill = runs.get("c-lineage-kill", {}).get("kill")
    d_kill = runs.get("d-pool-lineage-kill")
    goal = f">= ideal-direct + {GOAL_POINTS * 100:.0f} points"
    checks = {
        f"(a) prefixpin llama_slots {goal}": concurrent is not None and concurrent >= GOAL_POINTS,
        f"(a, serial) prefixpin llama_slots {goal}": serial is not None and serial >= GOAL_POINTS,
        f"(a, serial) prefixpin llama_slots auto {goal}": serial_auto is not None and serial_auto >= GOAL_POINTS,
        **{
            f"(a, defaults, serial) prefixpin llama_slots{' auto' if n == 'slots-auto' else ''} >= "
            f"{GOAL_RATIO:.0%} of prefixpin without": v is not None and v >= GOAL_RATIO
            for n, v in defaults.items()
        },
        "(b) lineage affinity above round robin": lin is not None and rr is not None and lin > rr,
        "(c) no request lost after the kill": kill is not None and kill["lost_sent_after_kill"] == 0,
        "(c) no request lost at all": bool(kill) and runs["c-lineage-kill"]["lost"] == 0,
        f"(d) each of two replicas serves >= {GOAL_SHARE:.0%} of the requests": bool(shares)
        and min(shares) >= GOAL_SHARE,
        f"(d) a pool of two caches >= {GOAL_RATIO:.0%} of one upstream": pool is not None and pool >= GOAL_RATIO,
        "(d) no request lost with a replica killed": d_kill is not None and d_kill["lost"] == 0,
        "no request lost in (a) and (b)": all(r["lost"] == 0 for r in runs.values() if r["part"] in "ab"),
    }
    structural = ("(c) no request lost after the kill", "no request lost in (a) and (b)")
    gate = {k: v for k, v in checks.items() if k in structural} if smoke else checks
    return {
        "a_points_over_ideal": concurrent,
        "a_serial_points_over_ideal": serial,
        "a_serial_auto_points_over_ideal": serial_auto,
        "a_defaults_slots_vs_none": defaults,
        "b_lineage_minus_round_robin": None if lin is None or rr is None else lin - rr,
        "d_pool_vs_one_upstream": pool,
        "d_replica_shares": shares,
        "checks": checks,
        "gated": list(gate),
        "ok": all(gate.values()),
        "skipped": skipped,
    }


def _shares(run: dict[str, Any] | None) -> list[float]:
    """Each replica's share of a pooled run's answered requests."""
    if not run:
        return []
    per = {k: v for k, v in run["requests_per_replica"].items() if k != "-"}
    total = sum(per.values())
    return [per.get(str(i), 0) / total for i in range(run["replicas"])] if total else []


def format_text(out: dict[str, Any]) -> str:
    head = ["run", "setup", "trace", "slots", "req", "lost", "1st-try fail", "prompt", "cached", "cached %", "forks %"]
    head += ["1 replica", "per replica", "wall s"]
    rows = [head]
    for r in out["runs"].values():
        one = r["sessions_on_one_replica"]
        per = r["requests_per_replica"]
        rows.append(
            [
                r["run"],
                r["setup"],
                r["trace"],
                "-" if not r["llama_slots"] else str(r["llama_slots"]),
                str(r["requests"]),
                str(r["lost"]),
                str(r["first_try_failures"]),
                f"{r['prompt_tokens']:,}",
                f"{r['cached_tokens']:,}",
                _pct(r["cached_ratio"]),
                _pct(r["fork_cached_ratio"]),
                "-" if one is None or r["replicas"] == 1 else f"{one}/{r['sessions']}",
                "-" if r["replicas"] == 1 else "/".join(str(per.get(str(i), 0)) for i in range(r["replicas"])),
                f"{r['run_wall_s']:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    git = out["git"]
    dirty = " (+ uncommitted changes)" if git["dirty"] else ""
    lines = [f"trace: {out['trace']}   prefixpin: {git['commit']}{dirty}"]
    lines += [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    for name, why in out["comparison"]["skipped"].items():
        lines.append(f"{name}: not run: {why}")
    for r in out["runs"].values():
        if "kill" in r:
            k = r["kill"]
            lines.append(
                f"{r['run']}: replica {k['replica']} SIGKILLed after {k['after_requests_done']} requests "
                f"({k['in_flight_at_kill']} in flight); lost {k['lost_sent_before_kill']} sent before the kill, "
                f"{k['lost_sent_after_kill']} of {k['requests_after_kill']} sent after it; cached "
                f"{_pct(k['cached_ratio_before_kill'])} before, {_pct(k['cached_ratio_after_kill'])} after; "
                f"{k['sessions_moved_off_killed_replica']} session(s) moved off it; failovers "
                f"{r['prefixpin'].get('replica_failovers_total')}"
            )
        slots = r["prefixpin"].get("llama_slots")
        if slots and r["llama_slots"]:
            lines.append(f"{r['run']}: at the end pinning {slots['pinning']} ({slots['why']})")
        for e in r["retried_errors"] + r["errors"]:
            lines.append(f"  {r['run']}: {e}")
    c = out["comparison"]
    lines.append("")
    lines += [f"[{'ok' if ok else 'MISS'}] {name}" for name, ok in c["checks"].items()]
    lines.append(f"logs: {out['log_dir']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--smoke", action="store_true", help="3 sessions x 2 turns; (a) concurrent, (b) prefixpin, (c) (CI)"
    )
    ap.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    ap.add_argument("--sessions", type=int, default=FULL.sessions)
    ap.add_argument("--turns", type=int, default=FULL.turns)
    ap.add_argument("--time-scale", type=float, default=Pace().time_scale, help="think time: the trace's gaps x this")
    ap.add_argument("--only", help="comma-separated contender names")
    ap.add_argument("--no-install", action="store_true", help="never install sglang-router (use it only if present)")
    ap.add_argument("--work-dir", type=Path, help="where traces and logs go (default: a new temp dir)")
    args = ap.parse_args(argv)
    spec = SMOKE if args.smoke else TraceSpec(args.sessions, args.turns, FULL.fork_every, FULL.seed)
    work, log_dir = work_dirs(args.work_dir, "prefixpin-bench-affinity-")
    traces: dict[tuple[str, str], list[TraceLine]] = {}
    for key, trace_spec in (("main", spec), ("three", THREE)):
        (work / key).mkdir(exist_ok=True)
        for name, path in zip(("prefix", "ideal"), write_pair(work / key, trace_spec), strict=True):
            traces[(key, name)] = read_trace(path, sys.stderr, "bench_affinity")[0]
    pace = Pace(time_scale=args.time_scale)
    wanted = set(args.only.split(",")) if args.only else None
    skipped: dict[str, str] = {}
    runs: dict[str, dict[str, Any]] = {}
    router_problem: str | None = None
    if not args.smoke and any(c.front == "router" for c in CONTENDERS):
        router_problem = router.ensure(install=not args.no_install)
    for c in CONTENDERS:
        if wanted is not None and c.name not in wanted:
            continue
        if args.smoke and not c.smoke:
            skipped[c.name] = "--smoke"
            continue
        if c.front == "router" and router_problem:
            skipped[c.name] = router_problem
            continue
        print(f"bench: {c.name} ...", file=sys.stderr, flush=True)
        runs[c.name] = run_one(c, traces[(c.spec, c.trace)], log_dir, pace)
    out: dict[str, Any] = {
        "git": _git_state(),
        "trace": f"sessions={spec.sessions} turns={spec.turns} fork_every={spec.fork_every} seed={spec.seed} "
        f"users={pace.users} stagger={pace.stagger_s}s gap={pace.gap_s}s time_scale={pace.time_scale}; "
        f"(d): sessions={THREE.sessions} turns={THREE.turns} fork_every={THREE.fork_every}",
        "llama": {"model": MODEL, "setups": SETUPS},
        "runs": runs,
        "comparison": compare(runs, skipped, args.smoke),
        "log_dir": str(log_dir),
    }
    (work / "report.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2) if args.json else format_text(out))
    return 0 if out["comparison"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
