"""The pieces of several workers, in one process: the link, summed metrics, the
config key and the port claim (the store's copies: test_replica.py).
tests/e2e/test_workers.py runs the real thing (``prefixpin serve --workers 2``
against llama-server)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from canonicalize import LineageRecord
from proxy.config import ConfigError, load
from proxy.link import Link, LinkClosed
from proxy.workers import _listen_socket, claim, cpus, exposition, merge, share, worker_count


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())


async def pair(
    left: Callable[[str, tuple[Any, ...]], Any], right: Callable[[str, tuple[Any, ...]], Any]
) -> tuple[Link, Link]:
    a, b = socket.socketpair()
    return await Link.open(a, left, name="left"), await Link.open(b, right, name="right")


def test_calls_go_both_ways_in_order() -> None:
    async def main() -> None:
        seen: list[Any] = []

        def right(name: str, args: tuple[Any, ...]) -> Any:
            seen.append((name, args))
            if name == "boom":
                raise ValueError("no such thing")
            if name == "len":
                return len(args[0])
            return sum(args)

        async def later() -> str:
            await asyncio.sleep(0.01)
            return "late"

        left, rt = await pair(lambda name, args: later(), right)
        assert await left.call("add", 1, 2, 3) == 6
        left.cast("add", 10)  # no answer, but handled before the next call
        assert await left.call("add", 4) == 4
        assert seen == [("add", (1, 2, 3)), ("add", (10,)), ("add", (4,))]
        with pytest.raises(RuntimeError, match="ValueError: no such thing"):
            await left.call("boom")
        assert await rt.call("anything") == "late"  # an awaitable answer, the other way
        assert await left.call("len", b"x" * 3_000_000) == 3_000_000  # a frame over many reads
        left.close()
        await rt.lost
        assert rt.closed
        with pytest.raises(LinkClosed):
            await left.call("add", 1)

    run(main)


def test_a_call_without_an_answer_times_out_and_a_lost_link_fails_pending_calls() -> None:
    async def main() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        left, right = await pair(lambda n, a: None, lambda n, a: never)
        with pytest.raises(LinkClosed, match="no answer in time"):
            await left.call("slow", timeout=0.05)
        pending = asyncio.ensure_future(left.call("slow"))
        await asyncio.sleep(0.01)
        right.close()
        with pytest.raises(LinkClosed):
            await pending

    run(main)


def _record(rid: str = "L1", **kw: Any) -> LineageRecord:
    return LineageRecord(id=rid, root=rid, skeleton="sys", pins={"clock": "02:30 PM"}, **kw)


def _scrape(n: int) -> list[Any]:
    r = CollectorRegistry()
    c = Counter("prefixpin_requests_total", "Requests handled", ("route", "role", "status"), registry=r)
    h = Histogram("prefixpin_overhead_seconds", "Overhead", buckets=(0.001, 0.01), registry=r)
    c.labels("chat_completions", "root", "200").inc(n)
    for _ in range(n):
        h.observe(0.005)
    return list(r.collect())


def test_metrics_of_all_workers_are_summed() -> None:
    merged = {f.name: f for f in merge([_scrape(2), _scrape(3)])}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in merged["prefixpin_requests"].samples}
    assert (
        samples[("prefixpin_requests_total", (("role", "root"), ("route", "chat_completions"), ("status", "200")))] == 5
    )
    text = exposition([_scrape(2), _scrape(3)]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    buckets = {
        s.labels.get("le"): s.value
        for s in families["prefixpin_overhead_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert buckets == {"0.001": 0.0, "0.01": 5.0, "+Inf": 5.0}
    first, second = _scrape(1), _scrape(1)
    created = [s.value for s in merge([second, first])[0].samples if s.name.endswith("_created")]
    assert created == [min(s.value for f in (first, second) for s in f[0].samples if s.name.endswith("_created"))]


def test_listen_workers_config() -> None:
    assert load(env={}).listen.workers == 1
    assert load(env={}, overrides={"listen.workers": "auto"}).public_dict()["listen"]["workers"] == "auto"
    assert load(env={}, overrides={"listen.workers": "3"}).listen.workers == 3
    assert load(env={}, overrides={"listen.workers": "auto"}).listen.workers == 0
    for bad in ("many", -1, 1.5, True, 1000):
        with pytest.raises(ConfigError, match=r"listen\.workers"):
            load(env={}, overrides={"listen.workers": bad})
    with pytest.raises(ConfigError, match=r"listen\.workers: must be 1"):
        load(env={}, overrides={"listen.workers": 2, "affinity.llama_slots": 4})
    auto = {"listen.workers": "auto"}
    assert worker_count(load(env={}, overrides={**auto, "affinity.llama_slots": 4})) == 1
    assert worker_count(load(env={}, overrides={**auto, "limits.max_concurrency": 8})) == 1  # exact, in one process
    assert worker_count(load(env={}, overrides={"limits.max_concurrency": 8, "listen.workers": 2})) == 2
    assert worker_count(load(env={}, overrides={"listen.workers": 5})) == 5
    assert worker_count(load(env={})) == 1
    assert 1 <= worker_count(load(env={}, overrides=auto)) <= 8


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
    config = load(env={}, overrides={"limits.max_concurrency": 5})
    mine = share(config, 2)
    assert mine.limits.max_concurrency == 3
    assert mine.upstream.max_connections == 256
    assert share(load(env={}), 2).limits.max_concurrency == 0  # no limit stays none
    assert share(config, 1) is config


def test_a_port_in_use_is_refused_even_to_a_second_prefixpin() -> None:
    held = claim("127.0.0.1", 0)
    port = held.getsockname()[1]
    worker = _listen_socket("127.0.0.1", port)  # a worker joins the port
    try:
        with pytest.raises(OSError):
            claim("127.0.0.1", port)
    finally:
        worker.close()
        held.close()
