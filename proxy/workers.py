"""Several worker processes on one port (``listen.workers``), their state in Redis.

One Python process serves about one core; the request path is CPU-bound, so
``prefixpin serve`` can run several workers.  What they share goes through
engines built for it, not through prefixpin:

- **Lineages** through Redis (``store.backend: redis``), exactly as several
  prefixpin services share one Redis: a continuation finds its lineage whichever
  worker its connection lands on.  With the embedded memory store each process
  would have its own lineages, so more than one worker needs Redis (``auto``
  means one worker without it).
- **Metrics** through prometheus_client's multiprocess mode: each worker writes
  its counters to files in a private directory and ``/metrics`` on any worker
  sums them all (a worker that died keeps its counts: no reset for Prometheus).

The serve process holds the port (bound, not listening, so a wrong address
fails at once), starts each worker (``python -m proxy.cli.worker``: a fresh
interpreter, its config read from its stdin), restarts one that dies, and on
SIGTERM / SIGINT stops them all.  Each worker listens on its own
``SO_REUSEPORT`` socket: the kernel spreads connections over them.  Process-wide
limits are split: each worker opens ``upstream.max_connections / N`` upstream
connections and admits ``limits.max_concurrency / N`` requests.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proxy.config import Config
from proxy.front import claim

log = logging.getLogger("prefixpin")
MAX_AUTO = 8
RESTART_DELAY_S = 1.0  # a worker that keeps dying is restarted at most this often
STOP_S = 5.0  # past listen.shutdown_grace_s: a worker's own stop ends its streams and flushes them


def worker_count(config: Config) -> int:
    """``listen.workers``, with ``auto`` (0) resolved: one per CPU (at most ``MAX_AUTO``)
    with Redis, else one (the config check refuses several without Redis)."""
    if config.listen.workers:
        return config.listen.workers
    if config.store.backend != "redis" or config.affinity.llama_slots or config.limits.max_concurrency:
        return 1  # one process: its own store, its slot table, its exact in-flight count
    return max(1, min(cpus(), MAX_AUTO))


def cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its affinity, within a container's CPU quota."""
    n = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def share(config: Config, workers: int) -> Config:
    """A worker's config: the process-wide limits divided among ``workers``."""
    if workers <= 1:
        return config
    limits, upstream = config.limits, config.upstream
    return dataclasses.replace(
        config,
        limits=dataclasses.replace(
            limits, max_concurrency=math.ceil(limits.max_concurrency / workers) if limits.max_concurrency else 0
        ),
        upstream=dataclasses.replace(upstream, max_connections=math.ceil(upstream.max_connections / workers)),
    )


def serve(config: Config, workers: int) -> int:
    """The serve process: start ``workers`` workers, keep them running, stop them."""
    try:
        hold = claim(config.listen.host, config.listen.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.listen.host, config.listen.port, exc.strerror)
        return 3
    metrics_dir = tempfile.mkdtemp(prefix="prefixpin-metrics-")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    # The workers' /metrics sum every worker's files: their config names the directory.
    environment = dataclasses.replace(config.environment, metrics_dir=metrics_dir)
    payload = pickle.dumps(dataclasses.replace(share(config, workers), environment=environment))
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "proxy.cli.worker"], stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        return proc

    log.info("prefixpin: %d workers on http://%s:%d", workers, config.listen.host, config.listen.port)
    procs = [start() for _ in range(workers)]
    try:
        while not stop:
            time.sleep(0.2)
            for i, proc in enumerate(procs):
                if proc.poll() is not None and not stop:
                    log.warning("worker %d (pid %d) exited with %s; starting another", i, proc.pid, proc.returncode)
                    time.sleep(RESTART_DELAY_S)
                    procs[i] = start()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + config.listen.shutdown_grace_s + STOP_S
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        hold.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
