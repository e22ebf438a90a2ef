"""One huge request must not stall the others: /healthz latency while a 30 MB body is in flight.

    python -m benchmarks.bench_bigbody                          # ~30 MB, 650,000 messages, 3 rounds
    python -m benchmarks.bench_bigbody --compare-ref 346c122    # the same against an older revision, same run
    python -m benchmarks.bench_bigbody --smoke                  # 3 MB, one round: proves the script works (CI)
    python -m benchmarks.bench_bigbody --shape system --compare-ref REF   # a body under 1 MiB that is costly to analyse

``--shape`` sends instead a body just under 1 MiB (under the size at which every body's
work goes to a worker thread) made of what costs the most to analyse: ``system``,
~19,000 one-line system messages; ``parts``, one system message of ~29,000 text parts;
``dates``, one system message of ~33,000 dated lines (a pin span on each).

Starts the instant Go upstream (benchmarks/overhead/upstream) and ``prefixpin
serve`` (default config, memory store) in front of it, then, per round: one
thread sends a chat completions request of ~650,000 short messages (with an
Authorization header) on its own connection while another polls ``GET /healthz``
every 10 ms on a second keep-alive connection.  It reports the /healthz latency
(p50, p99, max) during the big request, the same with no big request in flight,
and the big request's own time.  Every prefixpin (this tree, and ``prefixpin@REF``
with ``--compare-ref``) runs in the same process tree, one after the other.

A benchmark, not a test: nothing is asserted about time.  It exits non-zero if
a big request is not answered 200 or a /healthz poll fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.overhead import targets, tools
from benchmarks.overhead.tools import BIN_DIR, Unavailable
from tests.infra.procs import Proc, start_prefixpin

POLL_S = 0.010
AUTH = "Bearer sk-bigbody-bench"


def big_body(n_messages: int) -> bytes:
    """A chat completions body of ``n_messages`` short messages (~46 bytes each on the wire)."""
    roles = ("user", "assistant")
    msgs = [{"role": roles[i % 2], "content": f"message {i:07d} ok"} for i in range(n_messages - 1)]
    msgs.insert(0, {"role": "system", "content": "You are a terse assistant."})
    return json.dumps({"model": "hermes-bench-model", "messages": msgs}, separators=(",", ":")).encode()


SHAPES = ("messages", "system", "parts", "dates")
UNDER = (1 << 20) - 16 * 1024  # the shapes' bodies: this many bytes at most


def shaped(shape: str) -> tuple[bytes, int]:
    """A body of ``shape`` (module docstring) of at most UNDER bytes, and how many items it has."""
    n = 1
    while True:  # the most items that fit, found by doubling then halving
        if len(_shape(shape, 2 * n)) > UNDER:
            break
        n *= 2
    lo, hi = n, 2 * n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(_shape(shape, mid)) <= UNDER else (lo, mid)
    return _shape(shape, lo), lo


def _shape(shape: str, n: int) -> bytes:
    user: dict[str, Any] = {"role": "user", "content": "hi"}
    messages: list[dict[str, Any]]
    if shape == "system":
        messages = [*({"role": "system", "content": f"rule {i}: be brief"} for i in range(n)), user]
    elif shape == "parts":
        parts = [{"type": "text", "text": f"rule {i}: be brief"} for i in range(n)]
        messages = [{"role": "system", "content": parts}, user]
    else:
        lines = "\n".join(f"Note {i} at 2026-12-02 13:{i % 60:02d}" for i in range(n))
        messages = [{"role": "system", "content": lines}, user]
    return json.dumps({"model": "hermes-bench-model", "messages": messages}, separators=(",", ":")).encode()


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Poller(threading.Thread):
    """GET /healthz every POLL_S on one keep-alive connection; latencies in ms, tagged with the send time."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        self.samples: list[tuple[float, float]] = []  # (sent at, latency ms)
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.conn.request("GET", "/healthz")
                resp = self.conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                self.conn.close()
            t1 = time.perf_counter()
            if ok:
                self.samples.append((t0, 1000 * (t1 - t0)))
            else:
                self.failures += 1
            self.stop.wait(max(0.0, POLL_S - (t1 - t0)))

    def between(self, start: float, end: float) -> list[float]:
        """Latencies of polls sent in [start, end], plus any poll that was still waiting at ``start``."""
        return [ms for t, ms in self.samples if start <= t <= end or (t < start < t + ms / 1000)]


def send_big(host: str, port: int, body: bytes) -> tuple[int, float, int]:
    """(status, seconds from first byte sent to last byte read, response bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=300)
    headers = {"Content-Type": "application/json", "Authorization": AUTH}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    elapsed = time.perf_counter() - t0
    conn.close()
    return resp.status, elapsed, len(data)


def measure(base: str, body: bytes, rounds: int, idle_s: float) -> dict[str, Any]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    poller = Poller(host, int(port))
    poller.start()
    time.sleep(idle_s)  # /healthz with nothing else in flight: the floor
    idle_end = time.perf_counter()
    out: dict[str, Any] = {"rounds": []}
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            status, elapsed, size = send_big(host, int(port), body)
            during = poller.between(t0, time.perf_counter())
            out["rounds"].append(
                {
                    "status": status,
                    "big_s": round(elapsed, 3),
                    "response_bytes": size,
                    "polls": len(during),
                    "healthz_p50_ms": round(_pct(during, 0.50), 2),
                    "healthz_p99_ms": round(_pct(during, 0.99), 2),
                    "healthz_max_ms": round(max(during, default=float("nan")), 2),
                }
            )
            time.sleep(0.5)
    finally:
        poller.stop.set()
        poller.join(5)
    idle = [ms for t, ms in poller.samples if t < idle_end]
    out["idle"] = {"polls": len(idle), "p50_ms": round(_pct(idle, 0.5), 2), "max_ms": round(max(idle, default=0), 2)}
    out["healthz_failures"] = poller.failures
    for key in ("big_s", "healthz_p99_ms", "healthz_max_ms"):
        out[f"median_{key}"] = round(statistics.median(r[key] for r in out["rounds"]), 3)
    return out


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"bigbody benchmark: {doc['body_bytes'] / 1e6:.2f} MB body, {doc['messages']:,} {doc['items']}; "
        f"/healthz polled every {POLL_S * 1000:g} ms; load average {doc['loadavg_start']} at start, "
        f"{doc['loadavg_end']} at end",
        "",
        "| target | round | status | big request s | /healthz polls | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, res in doc["targets"].items():
        idle = res["idle"]
        lines.append(f"| {name} | idle | - | - | {idle['polls']} | {idle['p50_ms']:.2f} | - | {idle['max_ms']:.2f} |")
        for i, r in enumerate(res["rounds"], 1):
            lines.append(
                f"| {name} | {i} | {r['status']} | {r['big_s']:.2f} | {r['polls']} | {r['healthz_p50_ms']:.2f} | "
                f"{r['healthz_p99_ms']:.2f} | {r['healthz_max_ms']:.2f} |"
            )
        lines.append(
            f"| {name} | **median** | | **{res['median_big_s']:.2f}** | | | **{res['median_healthz_p99_ms']:.2f}** "
            f"| **{res['median_healthz_max_ms']:.2f}** |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_bigbody", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=650_000, help="messages in the big body (~46 bytes each)")
    ap.add_argument("--rounds", type=int, default=3, help="big requests per target")
    ap.add_argument("--compare-ref", metavar="REF", help="also run prefixpin at git revision REF")
    ap.add_argument("--shape", choices=SHAPES, default="messages", help="a body under 1 MiB instead (module docstring)")
    ap.add_argument("--smoke", action="store_true", help="65,000 messages (~3 MB, still a big body), one round")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if args.smoke:
        args.messages, args.rounds = 65_000, 1
    if args.shape == "messages":
        body, items = big_body(args.messages), "messages"
    else:
        body, args.messages = shaped(args.shape)
        items = {"system": "system messages", "parts": "system text parts", "dates": "dated lines"}[args.shape]
    doc: dict[str, Any] = {
        "body_bytes": len(body),
        "shape": args.shape,
        "messages": args.messages,
        "items": items,
        "loadavg_start": tools.loadavg(),
    }
    logs = BIN_DIR / "logs-bigbody"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="prefixpin-bigbody-") as tmp:
        up_proc, up = targets.start_upstream(logs)
        try:
            runs: list[tuple[str, Path | None]] = [("prefixpin", None)]
            if args.compare_ref:
                runs.append((f"prefixpin@{args.compare_ref}", targets.checkout(args.compare_ref, Path(tmp) / "ref")))
            for name, source in runs:
                print(f"{name}: {len(body) / 1e6:.1f} MB x {args.rounds} ...", file=sys.stderr, flush=True)
                proc: Proc | None = None
                try:
                    proc, base = start_prefixpin(logs, upstream=up, name=name.replace("@", "-"), source=source)
                    results[name] = measure(base, body, args.rounds, idle_s=0.5 if args.smoke else 2.0)
                    results[name]["pid"] = proc.popen.pid
                finally:
                    if proc is not None:
                        proc.stop()
        finally:
            up_proc.stop()
    doc["targets"] = results
    doc["loadavg_end"] = tools.loadavg()
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    bad = [f"{n}: status {r['status']}" for n, res in results.items() for r in res["rounds"] if r["status"] != 200] + [
        f"{n}: {res['healthz_failures']} /healthz failures" for n, res in results.items() if res["healthz_failures"]
    ]
    if bad:
        print("bench_bigbody failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Unavailable as exc:
        raise SystemExit(f"bench_bigbody: {exc}") from None
