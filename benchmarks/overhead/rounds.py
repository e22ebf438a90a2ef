"""Running wrk against every target, phase by phase, in rounds.

A phase is one workload at one connection count.  Within a phase the targets
take turns, round after round (``repeat``), so the rows of a table are measured
within seconds of each other, and a row reports the medians of its rounds
(:func:`medians`): on a machine whose speed drifts by the minute that keeps a
ratio side by side.  Every other round takes the targets in reverse order
(:func:`turns`: A B C, C B A, ...), so no target always follows the same one (its
aftermath: a recording target's writes still being flushed, a busy target's
caches) and a drift within a round weighs on every target alike.

Before each measurement the target is left to go idle (restarted if it will not),
the runner waits (up to ``idle_wait_s``) until processes outside the benchmark use
under a quarter of a core, then warms the target up and measures it.  Each wrk run
starts its request numbers where no earlier run went, so the mix starts new
conversations every time.  Besides wrk's figures a run records the target's own
CPU time per request, the CPU the rest of the machine used meanwhile
(``other_cores``: a noisy row can be told from a slow target), and, for
prefixpin, the roles of the requests and its own mean overhead from /metrics.
With ``max_other``, a run during which other processes used more than that many
cores is measured again (a shared machine's busy minute would otherwise be a
round's figure).
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from benchmarks.overhead import roles, wrk
from benchmarks.overhead.targets import CLIENT_HEADERS, Target
from benchmarks.overhead.workloads import Workload

Run = dict[str, Any]
T = TypeVar("T")
PASSES_PER_RUN = 10_000  # request numbers reserved per wrk run, in passes over the templates


@dataclass(frozen=True)
class Phase:
    """One workload at ``conns`` connections."""

    workload: str
    conns: int

    @property
    def key(self) -> str:
        return f"{self.workload}-c{self.conns}"


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    duration_s: int
    warmup_s: int
    timeout_s: int
    settle_s: float
    idle_wait_s: float = 0.0
    repeat: int = 1
    max_other: float | None = None  # a run during which others used more cores is measured again
    retries: int = 3
    priority: int | None = None  # wrk's scheduling weight (tools.prioritize)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores) since boot."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:9]]
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU time of this process's finished children: the wrk runs."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def own_overhead(base: str) -> tuple[float, float] | None:
    """(sum, count) of prefixpin's ``prefixpin_overhead_seconds`` histogram, if it answers."""
    try:
        text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    except httpx.HTTPError:
        return None
    total = re.search(r"^prefixpin_overhead_seconds_sum(?:\{[^}]*\})? (\S+)$", text, re.M)
    count = re.search(r"^prefixpin_overhead_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return (float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0)


class Runner:
    def __init__(self, workloads: dict[str, Workload], log_dir: Path, plan: Plan) -> None:
        self.workloads = workloads
        self.log_dir = log_dir
        self.plan = plan
        self.targets: list[Target] = []
        self._runs = 0

    def next_start(self, workload: Workload) -> int:
        """The first request number of a new wrk run: a fresh stretch, starting at turn 0."""
        self._runs += 1
        return self._runs * PASSES_PER_RUN * len(workload.templates)

    def settle(self, target: Target) -> bool:
        """Wait until the target uses under 5% of a core; restart it if it will not."""
        deadline = time.monotonic() + self.plan.settle_s
        last = target.cpu_seconds()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = target.cpu_seconds()
            if now - last < 0.0125:
                return True
            last = now
        if target.procs or target.alias_of is not None:
            log(f"  {target.name} still busy after {self.plan.settle_s:g}s; restarting it")
            target.restart(self.log_dir)
        return False

    def ours_s(self) -> float:
        return sum(t.cpu_seconds() for t in self.targets if t.alias_of is None)

    def wait_idle(self) -> float:
        """Wait until the rest of the machine uses < 0.25 cores (at most idle_wait_s); its last load."""
        deadline = time.monotonic() + self.plan.idle_wait_s
        while True:
            busy0, ours0 = machine_busy_s(), self.ours_s()
            time.sleep(0.5)
            other = (machine_busy_s() - busy0 - (self.ours_s() - ours0)) / 0.5
            if other < 0.25 or time.monotonic() >= deadline:
                return other

    def wrk(self, target: Target, phase: Phase, duration_s: int) -> wrk.Load:
        workload = self.workloads[phase.workload]
        return wrk.run(
            target.url,
            workload.path,
            conns=phase.conns,
            duration_s=duration_s,
            start=self.next_start(workload),
            headers={**CLIENT_HEADERS, **target.headers},
            timeout_s=self.plan.timeout_s,
            priority=self.plan.priority,
        )

    def measure(self, target: Target, phase: Phase) -> Run:
        """One measured run; again (up to ``retries`` times) while others took over ``max_other`` cores."""
        run = self.measure_once(target, phase)
        tries = 1
        limit = self.plan.max_other
        while limit is not None and run.get("other_cores", 0) > limit and tries <= self.plan.retries:
            log(f"(others used {run['other_cores']:.2f} cores; again)", end=" ")
            run = self.measure_once(target, phase)
            tries += 1
        run["tries"] = tries
        return run

    def measure_once(self, target: Target, phase: Phase) -> Run:
        settled = self.settle(target)
        if target.base is None:
            return {"target": target.name, "phase": phase.key, "unavailable": target.reason}
        if self.plan.idle_wait_s > 0:
            self.wait_idle()
        if self.plan.warmup_s > 0:
            self.wrk(target, phase, self.plan.warmup_s)
        watch_prefixpin = target.name.startswith("prefixpin") and target.alias_of is None
        own0 = own_overhead(target.base) if watch_prefixpin else None
        roles0 = roles.counted(target.base) if watch_prefixpin else None
        cpu0, ours0, kids0, busy0, t0 = (
            target.cpu_seconds(),
            self.ours_s(),
            children_cpu_s(),
            machine_busy_s(),
            time.monotonic(),
        )
        load = self.wrk(target, phase, self.plan.duration_s)
        cpu = target.cpu_seconds() - cpu0
        wall = time.monotonic() - t0
        kids = children_cpu_s() - kids0
        other = max(0.0, (machine_busy_s() - busy0 - (self.ours_s() - ours0) - kids) / wall)
        run: Run = {
            "target": target.name,
            "phase": phase.key,
            "settled_before": settled,
            "requests": load.requests,
            "rps": round(load.rps, 1),
            "errors": load.error_count,
            "error_kinds": load.errors,
            "latency_ms": {"p50": load.p50_ms, "p90": load.p90_ms, "p99": load.p99_ms, "max": load.max_ms},
            "cpu_ms_per_req": round(1000 * cpu / max(load.requests, 1), 4),
            "wrk_cpu_ms_per_req": round(1000 * kids / max(load.requests, 1), 4),
            "other_cores": round(other, 2),
        }
        if own0 is not None and (own1 := own_overhead(target.base)) is not None and own1[1] > own0[1]:
            run["own_overhead_ms"] = round(1000 * (own1[0] - own0[0]) / (own1[1] - own0[1]), 4)
        if roles0 is not None and (roles1 := roles.counted(target.base)) is not None:
            run["roles"] = {k: v for k, v in (roles1 - roles0).items() if v}
        return run

    def run(self, targets: list[Target]) -> list[Run]:
        self.targets = targets
        results = []
        for phase in self.plan.phases:
            for round_ in range(self.plan.repeat):
                for target in turns(targets, round_):
                    if target.base is None:
                        continue
                    log(f"{phase.key:<10} round {round_ + 1}  {target.name:<22}", end=" ")
                    started = time.monotonic()
                    res = self.measure(target, phase)
                    res["round"] = round_
                    results.append(res)
                    _log(res, started)
        return results


def turns(targets: Sequence[T], round_: int) -> list[T]:
    """The order the targets take in round ``round_`` (from 0): as given, reversed in odd rounds."""
    return list(targets) if round_ % 2 == 0 else list(reversed(targets))


def _log(res: Run, started: float) -> None:
    if "unavailable" in res:
        log(f"unavailable: {res['unavailable']}")
        return
    lat = res["latency_ms"]
    log(
        f"{res['rps']:>8,.0f} req/s  p50 {lat['p50']:.3f} ms  p99 {lat['p99']:.3f} ms  errors {res['errors']}  "
        f"other load {res['other_cores']:.2f} cores  ({time.monotonic() - started:.0f}s)"
    )


def medians(runs: list[Run]) -> list[Run]:
    """One run per (target, phase): each figure the median of its rounds, requests and
    errors summed, roles summed; ``rounds`` keeps every round's req/s and p50."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r["target"], r["phase"]), []).append(r)
    out = []
    for group in groups.values():
        ok = [r for r in group if "latency_ms" in r]
        if not ok:
            out.append(group[0])
            continue
        merged = dict(ok[0])
        merged.pop("round", None)
        for key in ("rps", "cpu_ms_per_req", "wrk_cpu_ms_per_req", "other_cores", "own_overhead_ms"):
            values = [r[key] for r in ok if r.get(key) is not None]
            if values:
                merged[key] = statistics.median(values)
        merged["latency_ms"] = {q: statistics.median(r["latency_ms"][q] for r in ok) for q in ok[0]["latency_ms"]}
        for key in ("requests", "errors"):
            merged[key] = sum(r[key] for r in ok)
        merged["error_kinds"] = _summed(r.get("error_kinds") or {} for r in ok)
        if any("roles" in r for r in ok):
            merged["roles"] = _summed(r.get("roles") or {} for r in ok)
        merged["rounds"] = [{"rps": r["rps"], "p50": r["latency_ms"]["p50"]} for r in ok]
        out.append(merged)
    return out


def _summed(dicts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


def log(msg: str, end: str = "\n") -> None:
    print(msg, end=end, file=sys.stderr, flush=True)


__all__ = ["Phase", "Plan", "Runner", "log", "medians", "turns"]
