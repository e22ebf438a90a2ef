"""Running the load generator against every target, phase by phase.

The phases (open loop at each rate, non-streamed then streamed, then saturation)
run one after the other, and within a phase every target takes its turn, so
all targets of one row are measured within seconds of each other on the same
machine.  Before each measurement the target is left to go idle (an overloaded
LiteLLM keeps working through its backlog long after the load generator gave
up; if it does not settle it is restarted), then warmed up, then measured; its
own CPU time over the measurement gives CPU ms per request.  With ``repeat``,
each phase runs that many rounds, every target taking its turn in each, and a
row reports the medians of its rounds (:func:`medians`): on a machine whose speed
drifts from one minute to the next, that keeps the comparison side by side.

The machine may be shared.  Before each measurement the runner waits (up to
``idle_wait_s``) until processes outside the benchmark use under a quarter of a
core, and it reports how much CPU they used during the measurement
(``other_cores``), so a noisy row can be told from a slow target.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.overhead.targets import CLIENT_HEADERS, Target


@dataclass(frozen=True)
class Phase:
    """One column group of the report: open loop at ``rate``, or closed loop with ``conns``."""

    stream: bool
    rate: float = 0.0
    conns: int = 0

    @property
    def key(self) -> str:
        kind = "stream" if self.stream else "plain"
        return f"open-{kind}-{self.rate:g}" if self.rate else f"closed-{kind}-{self.conns}"


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    duration_s: float
    warmup_s: float
    timeout_s: float
    settle_s: float
    idle_wait_s: float = 0.0
    repeat: int = 1  # rounds per phase, the targets taking turns in each: one row is their medians


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores) since boot."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:9]]
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def prefixpin_overhead(base: str) -> tuple[float, float] | None:
    """(sum, count) of prefixpin's own ``prefixpin_overhead_seconds`` histogram, if it answers."""
    try:  # an overloaded prefixpin may not answer /metrics in time: then there is no figure
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = re.search(r"^prefixpin_overhead_seconds_sum(?:\{[^}]*\})? (\S+)$", text, re.M)
    count = re.search(r"^prefixpin_overhead_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return (float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0)


class Runner:
    def __init__(self, loadgen: Path, bodies: dict[bool, Path], log_dir: Path, plan: Plan) -> None:
        self.targets: list[Target] = []
        self.loadgen = loadgen
        self.bodies = bodies
        self.log_dir = log_dir
        self.plan = plan

    def loadgen_argv(self, target: Target, phase: Phase, duration: float, rate: float | None = None) -> list[str]:
        argv = [
            str(self.loadgen),
            "-url",
            target.url,
            "-bodies",
            str(self.bodies[phase.stream]),
            "-duration",
            f"{duration}s",
            "-timeout",
            f"{self.plan.timeout_s}s",
        ]
        if phase.stream:
            argv.append("-stream")
        if phase.rate:
            argv += ["-rate", f"{rate if rate is not None else phase.rate:g}"]
        else:
            argv += ["-conns", str(phase.conns)]
        for k, v in {**CLIENT_HEADERS, **target.headers}.items():
            argv += ["-H", f"{k}: {v}"]
        return argv

    def _loadgen(self, argv: list[str]) -> dict[str, Any]:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr.strip()}")
        return dict(json.loads(done.stdout))

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

    def measure(self, target: Target, phase: Phase) -> dict[str, Any]:
        settled = self.settle(target)
        if target.base is None:
            return {"target": target.name, "phase": phase.key, "unavailable": target.reason}
        other_before = self.wait_idle() if self.plan.idle_wait_s > 0 else None
        if self.plan.warmup_s > 0:
            warm_rate = min(phase.rate, 50.0) if phase.rate else None
            self._loadgen(self.loadgen_argv(target, phase, self.plan.warmup_s, warm_rate))
        own0 = prefixpin_overhead(target.base) if target.name.startswith("prefixpin") else None
        cpu0, ours0, kids0, busy0, t0 = (
            target.cpu_seconds(),
            self.ours_s(),
            children_cpu_s(),
            machine_busy_s(),
            time.monotonic(),
        )
        result = self._loadgen(self.loadgen_argv(target, phase, self.plan.duration_s))
        cpu = target.cpu_seconds() - cpu0
        wall = time.monotonic() - t0
        ours = self.ours_s() - ours0 + children_cpu_s() - kids0
        other = max(0.0, (machine_busy_s() - busy0 - ours) / wall)
        result.update(
            target=target.name,
            phase=phase.key,
            settled_before=settled,
            cpu_s=round(cpu, 3),
            cpu_ms_per_req=round(1000 * cpu / max(result["sent"], 1), 3),
            other_cores=round(other, 2),
            other_cores_before=None if other_before is None else round(other_before, 2),
        )
        own1 = prefixpin_overhead(target.base) if own0 is not None else None
        if own0 is not None and own1 is not None and own1[1] > own0[1]:
            result["own_overhead_ms"] = round(1000 * (own1[0] - own0[0]) / (own1[1] - own0[1]), 3)
        return result

    def run(self, targets: list[Target]) -> list[dict[str, Any]]:
        self.targets = targets
        results = []
        for phase in self.plan.phases:
            for round_ in range(self.plan.repeat):
                for target in targets:
                    if target.base is None:
                        continue
                    log(f"{phase.key:<22} {target.name:<10}", end=" ")
                    started = time.monotonic()
                    res = self.measure(target, phase)
                    res["round"] = round_
                    results.append(res)
                    self._log(res, started)
        return results

    @staticmethod
    def _log(res: dict[str, Any], started: float) -> None:
        if "unavailable" in res:
            log(f"unavailable: {res['unavailable']}")
            return
        lat = res["latency_ms"]
        log(
            f"p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  {res['achieved_rps']:.0f} req/s  "
            f"errors {res['errors']}  other load {res['other_cores']:.2f} cores  "
            f"({time.monotonic() - started:.0f}s)"
        )


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per (target, phase): with several rounds, each figure is the median of
    the rounds' (errors and requests summed), and ``rounds`` keeps them all."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["target"], r["phase"]), []).append(r)
    out = []
    for group in groups.values():
        ok = [r for r in group if "latency_ms" in r]
        if len(group) == 1 or not ok:
            out.append(group[0])
            continue
        merged = dict(ok[0])
        for key in ("achieved_rps", "cpu_ms_per_req", "cpu_s", "other_cores", "own_overhead_ms"):
            values = [r[key] for r in ok if r.get(key) is not None]
            if values:
                merged[key] = statistics.median(values)
        merged["latency_ms"] = {q: statistics.median(r["latency_ms"][q] for r in ok) for q in ok[0]["latency_ms"]}
        for key in ("sent", "ok", "errors"):
            if all(key in r for r in ok):
                merged[key] = sum(r[key] for r in ok)
        kinds: dict[str, int] = {}
        for r in ok:
            for kind, n in (r.get("error_kinds") or {}).items():
                kinds[kind] = kinds.get(kind, 0) + n
        merged["error_kinds"] = kinds
        merged["rounds"] = [
            {"p50": r["latency_ms"]["p50"], "rps": r["achieved_rps"], "cpu_ms_per_req": r.get("cpu_ms_per_req")}
            for r in ok
        ]
        merged.pop("round", None)
        out.append(merged)
    return out


def log(msg: str, end: str = "\n") -> None:
    print(msg, end=end, file=sys.stderr, flush=True)
