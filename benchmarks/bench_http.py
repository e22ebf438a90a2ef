"""prefixpin's own HTTP layers next to the libraries it could use instead: CPU per
request on prefixpin's real traffic, and how each meets a hostile peer.

    python -m benchmarks.bench_http                 # ~10 min on 2 cores: markdown tables
    python -m benchmarks.bench_http --smoke         # a minute: proves it runs
    python -m benchmarks.bench_http --json --out r.json

**Servers** (our ``proxy.front``, uvicorn with httptools and with h11, granian,
hypercorn), each one process and one worker on uvloop, serve prefixpin's real app
(``benchmarks/http/apps.py``) in front of the instant nginx upstream of
``bench_overhead``; wrk sends the 45 KB hermes body (``-c16``: CPU per request and
requests per second; ``-c1``: p50).  The cost is the server's CPU time (all its
processes) over the requests answered.  The servers take turns in each of
``--repeat`` rounds; rows are medians.  Then each serves a probe app and meets a
hostile client (``benchmarks/http/server_probes.py``).

**Clients** (ours, aiohttp, httpx, pyreqwest: reqwest/hyper in Rust) each run in a
process of their own against ``benchmarks/http/upstream.py``: CPU per request for
the 45 KB JSON request and for a 1,000-event stream (4 requests at a time), then the
hostile answers (a 1 MiB head, a gzip bomb, 64 MiB to a reader that stops, an IDNA
host through a proxy).

The libraries are installed, pinned, into a cache venv (``benchmarks/http/env.py``),
never into prefixpin's dependencies.  A benchmark, not a test: ``--smoke`` fails only
when something could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http import env, server_probes
from benchmarks.http.clients import CLIENTS
from benchmarks.http.servers import SERVERS, running
from benchmarks.overhead import nginx, workloads, wrk
from benchmarks.overhead.tools import loadavg
from tests.infra.procs import REPO, Proc, free_port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_http", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="short runs, one round")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--out", type=Path, help="also write the JSON document here")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds, the servers (clients) taking turns")
    ap.add_argument("--requests", type=int, default=2000, help="requests per client run")
    ap.add_argument(
        "--skip", default="", help="comma-separated: server-figures,server-probes,client-figures,client-probes"
    )
    return ap.parse_args(argv)


# -- servers --------------------------------------------------------------------------------------------------


def server_figures(names: list[str], work: Path, log_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    up_proc, up_base = nginx.upstream(work, log_dir)
    load = workloads.repeated(work)
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    try:
        for _ in range(args.repeat):
            for name in names:
                rows[name].append(_one_server(name, up_base, load.path, log_dir, args.duration))
    finally:
        up_proc.stop()
    return {n: _medians(r) for n, r in rows.items()}


def _one_server(name: str, upstream: str, bodies: Path, log_dir: Path, duration: int) -> dict[str, float]:
    with running(name, "benchmarks.http.apps:prefixpin", log_dir, {"PREFIXPIN_UPSTREAM": upstream}) as r:
        url = r.base + "/v1/chat/completions"
        assert httpx.get(r.base + "/healthz", timeout=10).status_code == 200
        wrk.run(url, bodies, conns=16, duration_s=1)  # warm-up
        cpu0 = r.cpu_s()
        sat = wrk.run(url, bodies, conns=16, duration_s=duration, start=100_000)
        cpu = r.cpu_s() - cpu0
        lat = wrk.run(url, bodies, conns=1, duration_s=duration, start=200_000)
    if sat.error_count or lat.error_count:
        raise RuntimeError(f"{name}: errors {sat.errors} {lat.errors}")
    return {"cpu_us": cpu / sat.requests * 1e6, "rps": sat.rps, "p50_ms": lat.p50_ms}


def server_behaviours(names: list[str], log_dir: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name in names:
        verdicts: dict[str, str] = {}
        with running(name, "benchmarks.http.apps:probe", log_dir, {}) as r:
            for probe, run in server_probes.PROBES.items():
                try:
                    verdicts[probe] = run(r)
                except Exception as exc:
                    verdicts[probe] = f"probe failed: {type(exc).__name__}"
        with running(name, "benchmarks.http.apps:probe", log_dir, {}, nofile=server_probes.FD_LIMIT) as r:
            verdicts["fd limit"] = server_probes.fd_limit(r)
        out[name] = verdicts
    return out


# -- clients --------------------------------------------------------------------------------------------------


def _client(python: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), "-m", "benchmarks.http.clients", *args],
        capture_output=True,
        text=True,
        env=env.environ(),
        cwd=REPO,
        timeout=600,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"clients {' '.join(args)} failed: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def client_figures(names: list[str], base: str, python: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for _ in range(args.repeat):
        for name in names:
            j = _client(python, "bench", "--client", name, "--base", base, "--kind", "json", "--n", str(args.requests))
            n = str(max(40, args.requests // 10))
            s = _client(python, "bench", "--client", name, "--base", base, "--kind", "stream", "--n", n)
            rows[name].append({"json_us": j["cpu_us"], "stream_ms": s["cpu_us"] / 1000})
    return {n: _medians(r) for n, r in rows.items()}


def client_behaviours(names: list[str], base: str, python: Path) -> dict[str, dict[str, str]]:
    return {n: _client(python, "probe", "--client", n, "--base", base) for n in names}


def start_upstream(python: Path, log_dir: Path) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc("bench-http-upstream", [str(python), "-m", "benchmarks.http.upstream", "--port", str(port)], log_dir)
    deadline = time.monotonic() + 60
    while "listening" not in proc.log_tail(5):
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the upstream did not start:\n{proc.log_tail()}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


# -- report ---------------------------------------------------------------------------------------------------


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# HTTP layers, {doc['date']} at {doc['commit']}",
        "",
        f"{doc['machine']}; load average before: {doc['load_before']}, after: {doc['load_after']}.",
        f"`{doc['command']}`",
        "",
    ]
    if doc.get("servers"):
        lines += ["## Servers, serving prefixpin's app (45 KB hermes POST, wrk)", ""]
        lines += ["| server | CPU µs / request (c16) | requests/s (c16) | p50 ms (c1) |", "|---|---:|---:|---:|"]
        for name, r in doc["servers"].items():
            lines.append(f"| {name} | {r['cpu_us']:,.0f} | {r['rps']:,.0f} | {r['p50_ms']:.2f} |")
        lines.append("")
    if doc.get("server_behaviours"):
        probes = list(next(iter(doc["server_behaviours"].values())))
        lines += ["## Servers, against a hostile client", ""]
        lines += ["| server | " + " | ".join(probes) + " |", "|---" * (len(probes) + 1) + "|"]
        for name, v in doc["server_behaviours"].items():
            lines.append(f"| {name} | " + " | ".join(v[p] for p in probes) + " |")
        lines.append("")
    if doc.get("clients"):
        lines += ["## Clients (4 requests at a time)", ""]
        lines += ["| client | CPU µs / 45 KB JSON request | CPU ms / 1,000-event stream |", "|---|---:|---:|"]
        for name, r in doc["clients"].items():
            lines.append(f"| {name} | {r['json_us']:,.0f} | {r['stream_ms']:.2f} |")
        lines.append("")
    if doc.get("client_behaviours"):
        probes = list(next(iter(doc["client_behaviours"].values())))
        lines += ["## Clients, against a hostile upstream", ""]
        lines += ["| client | " + " | ".join(probes) + " |", "|---" * (len(probes) + 1) + "|"]
        for name, v in doc["client_behaviours"].items():
            lines.append(f"| {name} | " + " | ".join(v[p] for p in probes) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.duration, args.repeat, args.requests = 1, 1, 200
    skip = set(filter(None, args.skip.split(",")))
    servers = [s for s in args.servers.split(",") if s]
    clients = [c for c in args.clients.split(",") if c]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    doc: dict[str, Any] = {
        "date": date.today().isoformat(),
        "commit": commit.stdout.strip() or "unknown",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": "python -m benchmarks.bench_http " + " ".join(argv if argv is not None else sys.argv[1:]),
        "load_before": loadavg(),
    }
    python = env.python()
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        work, log_dir = Path(tmp), Path(tmp) / "logs"
        log_dir.mkdir()
        if "server-figures" not in skip:
            doc["servers"] = server_figures(servers, work, log_dir, args)
        if "server-probes" not in skip:
            doc["server_behaviours"] = server_behaviours(servers, log_dir)
        if not {"client-figures", "client-probes"} <= skip:
            up, base = start_upstream(python, log_dir)
            try:
                if "client-figures" not in skip:
                    doc["clients"] = client_figures(clients, base, python, args)
                if "client-probes" not in skip:
                    doc["client_behaviours"] = client_behaviours(clients, base, python)
            finally:
                up.stop()
    doc["load_after"] = loadavg()
    text = json.dumps(doc, indent=2) if args.json else markdown(doc)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
