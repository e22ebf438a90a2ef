"""Several workers (proxy.workers): how many, what each may take, the port they share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.config import ConfigError, load
from proxy.front import claim, listen
from proxy.workers import cpus, share, worker_count

REDIS = {"store.backend": "redis"}


def test_listen_workers_config() -> None:
    assert load(env={}).listen.workers == 1
    assert load(env={}, overrides={"listen.workers": "auto"}).public_dict()["listen"]["workers"] == "auto"
    assert load(env={}, overrides={"listen.workers": "3", **REDIS}).listen.workers == 3
    assert load(env={}, overrides={"listen.workers": "auto"}).listen.workers == 0
    for bad in ("many", -1, 1.5, True, 1000):
        with pytest.raises(ConfigError, match=r"listen\.workers"):
            load(env={}, overrides={"listen.workers": bad})
    with pytest.raises(ConfigError, match=r"listen\.workers: must be 1"):
        load(env={}, overrides={"listen.workers": 2, "affinity.llama_slots": 4, **REDIS})
    auto = {"listen.workers": "auto", **REDIS}
    assert worker_count(load(env={}, overrides={**auto, "affinity.llama_slots": 4})) == 1
    assert worker_count(load(env={}, overrides={**auto, "limits.max_concurrency": 8})) == 1  # exact, in one process
    assert worker_count(load(env={}, overrides={**REDIS, "limits.max_concurrency": 8, "listen.workers": 2})) == 2
    assert worker_count(load(env={}, overrides={**REDIS, "listen.workers": 5})) == 5
    assert worker_count(load(env={})) == 1
    assert 1 <= worker_count(load(env={}, overrides=auto)) <= 8
    assert worker_count(load(env={}, overrides={"listen.workers": "auto"})) == 1  # the memory store: one process


def test_several_workers_need_redis() -> None:
    """Workers share lineages through Redis: with the memory store each would have its own."""
    with pytest.raises(ConfigError, match=r"listen\.workers: 2 processes share lineages through Redis"):
        load(env={}, overrides={"listen.workers": 2})


def test_auto_counts_the_cpus_a_container_may_use(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    mine = len(os.sched_getaffinity(0))
    quota.write_text("max 100000\n")
    assert cpus(quota) == mine
    quota.write_text("50000 100000\n")  # half a CPU: still one worker
    assert cpus(quota) == 1
    quota.write_text(f"{100000 * mine + 1} 100000\n")  # a quota above the affinity
    assert cpus(quota) == mine
    assert cpus(tmp_path / "absent") == mine


def test_process_wide_limits_are_split_among_workers() -> None:
    config = load(env={}, overrides={"limits.max_concurrency": 5, **REDIS})
    mine = share(config, 2)
    assert mine.limits.max_concurrency == 3
    assert mine.upstream.max_connections == 256
    assert share(load(env={}), 2).limits.max_concurrency == 0  # no limit stays none
    assert share(config, 1) is config


def test_a_port_in_use_is_refused_even_to_a_second_prefixpin() -> None:
    held = claim("127.0.0.1", 0)
    port = held.getsockname()[1]
    worker = listen("127.0.0.1", port, reuse_port=True)  # a worker joins the port
    try:
        with pytest.raises(OSError):
            claim("127.0.0.1", port)
    finally:
        worker.close()
        held.close()
