"""Load generation: wrk (Debian's, closed loop) driven with ``wrk.lua``.

``wrk -t1 -cC -dNs`` keeps C connections busy, each sending its next request as
soon as its previous answer is in: at C=16 that is saturation, at C=1 the
latency of one request at a time.  One thread, so one Lua state numbers the
requests in order (the conversation mix depends on it) and wrk takes at most
one core.  wrk is a compiled event loop: on this project's 2-core machine it
drives a bare instant upstream several times faster than nginx proxies, which
is what makes a ratio to nginx mean anything; the report checks it every run.

An error is a socket error (connect, read, write), a timeout, or a status of
400 and up (wrk counts those; 3xx is not expected from any target).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.overhead.tools import ensure_deb, prioritize

SCRIPT = Path(__file__).resolve().parent / "wrk.lua"
ERROR_KINDS = ("connect", "read", "write", "timeout", "status")


@dataclass(frozen=True)
class Load:
    """One wrk run's figures."""

    requests: int
    duration_s: float
    errors: dict[str, int]  # by kind, only kinds that occurred
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def wrk_binary() -> str:
    return ensure_deb("wrk", "wrk")


def run(
    url: str,
    bodies: Path,
    *,
    conns: int,
    duration_s: int,
    start: int = 0,
    headers: dict[str, str] | None = None,
    timeout_s: int = 5,
    priority: int | None = None,
) -> Load:
    """wrk against ``url`` for ``duration_s`` whole seconds; request numbers begin at ``start``;
    ``priority``: its session's scheduling weight (``tools.prioritize``)."""
    argv = [wrk_binary(), "-t1", f"-c{conns}", f"-d{max(1, duration_s)}s", f"--timeout={timeout_s}s"]
    for k, v in (headers or {}).items():
        argv += ["-H", f"{k}: {v}"]
    argv += ["-s", str(SCRIPT), url, "--", str(bodies), str(start)]
    # A session of its own, like the targets', so that its priority is its own.
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        prioritize(proc.pid, priority)
        out, err = proc.communicate(timeout=duration_s + timeout_s + 60)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {(err or out).strip()[-500:]}")
    return parse(line.removeprefix("WRKJSON "))


def parse(text: str) -> Load:
    """A :class:`Load` from the JSON object ``wrk.lua``'s ``done()`` prints."""
    d = json.loads(text)
    return Load(
        requests=int(d["requests"]),
        duration_s=d["duration_us"] / 1e6,
        errors={k: int(d[k]) for k in ERROR_KINDS if d.get(k)},
        p50_ms=d["p50_us"] / 1000,
        p90_ms=d["p90_us"] / 1000,
        p99_ms=d["p99_us"] / 1000,
        mean_ms=d["mean_us"] / 1000,
        max_ms=d["max_us"] / 1000,
    )


__all__ = ["Load", "parse", "run", "wrk_binary"]
