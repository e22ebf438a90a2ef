"""Shared fixtures: real processes on loopback (llama-server, redis-server, the
recording upstream, ``prefixpin serve``), started once per session where they can
be shared and per test where a test changes them."""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.infra.procs import Proc, free_port, start_llama, start_prefixpin, start_redis
from tests.infra.redis_topologies import Cluster, start_cluster

T = TypeVar("T")


_CLIENTS: list[Any] = []


def track(client: T) -> T:
    """Close ``client`` (an openai / anthropic / httpx client) after the current test."""
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def llama_server(log_dir: Path) -> Iterator[str]:
    """A real llama-server (built from the llama-cpp-python sdist, tiny random GGUF)."""
    proc, base = start_llama(log_dir)
    yield base
    proc.stop()


class Recorder:
    """Client for tests.infra.recorder: tell it how to answer, read what it got."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, trust_env=False, timeout=10)

    def control(self, **ctl: Any) -> None:
        self.http.post("/_control", json=ctl).raise_for_status()

    def reset(self) -> None:
        self.http.post("/_reset").raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        out = self.http.get("/_requests").json()
        for r in out:
            r["body"] = base64.b64decode(r.pop("body_b64"))
        return out

    def bodies(self, path: str = "/v1/chat/completions") -> list[bytes]:
        return [r["body"] for r in self.requests() if r["path"] == path]


@pytest.fixture(scope="session")
def recorder_proc(log_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc("recorder", [sys.executable, "-m", "tests.infra.recorder", "--port", str(port)], log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")
    yield base
    proc.stop()


@pytest.fixture
def recorder(recorder_proc: str) -> Iterator[Recorder]:
    rec = Recorder(recorder_proc)
    rec.reset()
    yield rec
    rec.reset()
    rec.http.close()


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / f"config-{free_port()}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
def serve(log_dir: Path) -> Iterator[Callable[..., str]]:
    """Start ``prefixpin serve`` processes; all are stopped after the test."""
    procs: list[Proc] = []

    def start(upstream: str, config: Path | None = None, env: dict[str, str] | None = None) -> str:
        proc, base = start_prefixpin(
            log_dir, upstream=upstream, config=config, env=env, name=f"prefixpin-{free_port()}"
        )
        procs.append(proc)
        return base

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_redis(log_dir)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def redis_cluster(log_dir: Path) -> Iterator[Cluster]:
    """A Redis Cluster of 3 masters and 3 replicas, shared by the session's tests (a
    test that kills a node starts its own: tests/infra/redis_topologies.py)."""
    cluster = start_cluster(log_dir)
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_proc(log_dir: Path) -> Iterator[Callable[..., tuple[Proc, str]]]:
    """A private redis-server a test may stop and restart (same port)."""
    procs: list[Proc] = []

    def start(port: int | None = None) -> tuple[Proc, str]:
        proc, url = start_redis(log_dir, port=port, name=f"redis-{free_port()}")
        procs.append(proc)
        return proc, url

    yield start
    for proc in procs:
        proc.stop()
