"""A real Prometheus server for tests: config from ``deploy/prometheus/``, HTTP API client.

The shipped ``deploy/prometheus/prometheus.yml`` is the starting point, so a test
that scrapes through it also proves the shipped jobs and paths are right; only
the targets and the intervals are replaced.  Storage lives in the test's tmp dir.
"""

from __future__ import annotations

import copy
import math
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.infra.procs import REPO, Proc, free_port
from tests.infra.wait import wait_until

DEPLOY_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


def prometheus_path() -> str | None:
    """The ``prometheus`` binary (Debian package ``prometheus``), or None when absent."""
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None


def scrape_config(targets: dict[str, str], *, interval: str = "1s") -> dict[str, Any]:
    """The shipped config with each job's target replaced (``{"prefixpin": "127.0.0.1:P"}``)."""
    config: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEPLOY_CONFIG.read_text()))
    config["global"] = {**config.get("global", {}), "scrape_interval": interval, "evaluation_interval": interval}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    missing = set(targets) - set(jobs)
    if missing:
        raise KeyError(f"{DEPLOY_CONFIG} has no job {sorted(missing)}")
    for name, target in targets.items():
        jobs[name]["static_configs"] = [{"targets": [target]}]
        jobs[name]["scrape_interval"] = interval
        jobs[name]["scrape_timeout"] = interval
    config["scrape_configs"] = [jobs[name] for name in targets]
    return config


class Prometheus:
    """Client for one server's HTTP API (``/api/v1``)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, trust_env=False, timeout=10)

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """Evaluate an instant query; returns ``data`` (``resultType`` and ``result``)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = self.http.get("/api/v1/query", params=params)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed ({r.status_code}): {expr}\n{body.get('error', r.text)}")
        return dict(body["data"])

    def values(self, expr: str, at: float | None = None) -> list[float]:
        """Every sample value of an instant query (vector or scalar), NaN included."""
        data = self.query(expr, at)
        if data["resultType"] == "scalar":
            return [float(data["result"][1])]
        return [float(sample["value"][1]) for sample in data["result"]]

    def scalar(self, expr: str) -> float | None:
        """The single value of ``expr``, or None while it has no sample."""
        found = self.values(expr)
        return found[0] if found else None

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` variable query lists."""
        r = self.http.get(f"/api/v1/label/{label}/values", params={"match[]": match})
        r.raise_for_status()
        return list(r.json()["data"])

    def scrape_timestamp(self, job: str) -> float:
        """Timestamp of the newest *scraped* sample (not the query time) of ``job``."""
        found = self.values(f'timestamp(up{{job="{job}"}})')
        return max(found, default=0.0)

    def wait_until(self, expr: str, want: float, timeout: float = 30.0) -> float:
        """Poll until ``expr`` evaluates to ``want``; returns the scrape time that showed it."""
        got: float | None = None

        def shows() -> bool:
            nonlocal got
            got = self.scalar(expr)
            return got is not None and math.isclose(got, want)

        wait_until(shows, timeout=timeout, interval=0.2, message=lambda: f"{expr} is {got}, not {want}")
        return time.time()

    def wait_scrapes_after(self, jobs: list[str], after: float, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until every job has ``count`` scrapes that started after ``after`` (unix seconds)."""
        deadline = time.monotonic() + timeout
        for job in jobs:
            seen, last = 0, after

            def scraped(job: str = job) -> bool:
                nonlocal seen, last
                ts = self.scrape_timestamp(job)
                if ts > last:
                    seen, last = seen + 1, ts
                return seen >= count

            wait_until(
                scraped,
                timeout=max(deadline - time.monotonic(), 0),
                interval=0.2,
                message=f"prometheus scraped {job} {count}x after {after}",
            )

    def close(self) -> None:
        self.http.close()


def start_prometheus(
    binary: str, config: dict[str, Any], work: Path, log_dir: Path, name: str = "prometheus"
) -> tuple[Proc, Prometheus]:
    """Start ``binary`` on a free loopback port with ``config``, storage under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    argv = [
        binary,
        f"--config.file={path}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    proc = Proc(name, argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/-/ready", timeout=60)
    return proc, Prometheus(base)
