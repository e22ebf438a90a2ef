"""deploy/compose.yaml for real: prefixpin in front of llama-server, state in Redis,
Prometheus scraping both, every Grafana dashboard query answered by that Prometheus.

The test runs ``podman-compose -f deploy/compose.yaml up -d`` as docs/deploy.md says,
with the host ports it publishes (``PREFIXPIN_PORT``, ``PROMETHEUS_PORT``: 8787 and
9090 by default) set to free ones: a ``prefixpin serve`` left running on 8787 (the
README's first command) neither takes the test's requests nor keeps the stack down.
The project's name and containers are the compose file's, so two test runs on one
host take turns (a lock in the cache dir) instead of taking each other's stack down.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import hermes
from tests.deploy.conftest import inspect, local, run, running_containers, save_logs, wait_ready
from tests.e2e.test_dashboard import DASHBOARD, Session, _exprs, _substitute, _system
from tests.infra.conversation import cached, two_turns
from tests.infra.llama import cache_lock
from tests.infra.procs import REPO, free_ports
from tests.infra.prometheus import Prometheus

COMPOSE = str(REPO / "deploy" / "compose.yaml")
PROJECT = "deploy"  # podman-compose names the project after the compose file's directory

pytestmark = [pytest.mark.deploy, pytest.mark.slow]


def compose(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    return run(["podman-compose", "-f", COMPOSE, *args], timeout=timeout, env=env).stdout


@dataclass(frozen=True)
class Stack:
    proxy: str  # prefixpin's base URL, as published
    prom: Prometheus


@pytest.fixture
def stack(images: list[str], log_dir: Path) -> Iterator[Stack]:
    """The stack up and ready; the test itself brings it down (``down`` is under test)."""
    with cache_lock("deploy-compose"):  # another test run's stack: its turn ends first
        proxy_port, prometheus_port = free_ports(2)
        compose("down", "-v")  # leftovers of an interrupted run (and their volumes)
        compose("up", "-d", env={"PREFIXPIN_PORT": str(proxy_port), "PROMETHEUS_PORT": str(prometheus_port)})
        prom = Prometheus(local(prometheus_port))
        try:
            wait_ready(local(proxy_port))
            yield Stack(local(proxy_port), prom)
        finally:
            prom.close()
            if running_containers(**{"io.podman.compose.project": PROJECT}):  # the test failed: keep the logs
                names = [f"{PROJECT}_{name}_1" for name in ("prefixpin", "llama", "redis", "prometheus")]
                save_logs(log_dir, names)
                compose("down", "-v")


def test_compose_stack(stack: Stack) -> None:
    proxy, prom = stack.proxy, stack.prom
    # Four containers, the published ports on loopback only, prefixpin's root read-only.
    assert sorted(running_containers(**{"io.podman.compose.project": PROJECT})) == sorted(
        f"{PROJECT}_{name}_1" for name in ("prefixpin", "llama", "redis", "prometheus")
    )
    info = inspect(f"{PROJECT}_prefixpin_1")
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    assert info["Config"]["User"] == "10001:10001"
    bindings = [(b["HostIp"], b["HostPort"]) for ports in info["HostConfig"]["PortBindings"].values() for b in ports]
    assert bindings == [("127.0.0.1", proxy.rsplit(":", 1)[1])]
    health = run(["podman", "healthcheck", "run", f"{PROJECT}_prefixpin_1"], check=False)
    assert health.returncode == 0, health.stdout + health.stderr

    # Both scrape targets up.
    prom.wait_until('sum(up{job=~"prefixpin|llama-server"})', 2, timeout=60)
    assert prom.scalar('up{job="prefixpin"}') == 1 and prom.scalar('up{job="llama-server"}') == 1

    # Two turns with a changing memory counter: the second is served from llama's cache.
    first, second, roles = two_turns(proxy)
    assert roles == ["root", "continuation"]
    assert cached(second) > 0, second
    assert cached(second) >= first.prompt_tokens // 2, (first, second)

    # The lineage lives in Redis (the compose file's store), not in the process.
    keys = run(["podman", "exec", f"{PROJECT}_redis_1", "redis-cli", "--scan", "--pattern", "pp:*"]).stdout.split()
    assert keys, "prefixpin recorded nothing in redis"

    # The dashboard's traffic (as tests/e2e/test_dashboard.py drives it), then every panel query.
    started = time.time()
    s = Session(proxy, prom)
    s.sent = 2  # the two turns above
    prom.wait_until('sum(prefixpin_requests_total{route="chat_completions"})', s.sent)
    tools = hermes.tools_full()
    s.turn(_system(0), "Which modules have no tests?", tools)
    s.turn(_system(1), "Write a test for the first one.", tools, stream=True)
    s.turn(
        _system(2, skills=hermes.SKILLS_REVIEW, session="20260514_143301_9f3c1a"),
        hermes.REVIEW_PROMPT,
        hermes.tools_review(),
        keep=False,
    )
    s.turn(_system(2), "Run it.", tools)
    assert s.rejected(_system(3), "Give me three options.", tools, n=3) == 400
    assert s.roles == ["root", "continuation", "fork", "continuation"]
    s.client.close()
    prom.wait_scrapes_after(["prefixpin", "llama-server"], time.time(), count=2, timeout=60)
    window = f"{math.ceil(time.time() - started) + 60}s"
    assert (prom.scalar('sum(prefixpin_cached_tokens_total{job="prefixpin"})') or 0) > 0
    assert (prom.scalar('sum(llamacpp:prompt_tokens_total{job="llama-server"})') or 0) > 0

    exprs = _exprs(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 20
    empty = []
    for title, expr in exprs:
        query = _substitute(expr, window)
        if not any(math.isfinite(v) for v in prom.values(query)):
            empty.append(f"{title}: {query}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

    # down: nothing of the project left, running or stopped.
    compose("down", "-v")
    assert running_containers(**{"io.podman.compose.project": PROJECT}) == []
    assert run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "-q"]).stdout == ""
