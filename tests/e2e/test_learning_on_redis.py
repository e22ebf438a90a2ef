"""Learning on the Redis that teams run (SPEC sections 2d and 2g), every server real:
what learning keeps for a tenant (the evidence of its counters, the links its roots
mark) and a resumed conversation found by its first message (recall, its next turns
too) work on a Redis Cluster of 3 masters and 3 replicas exactly as on the memory
store.  Two request flows (two processes' canonicalizers, memos and store clients)
take turns on the cluster and forward, byte for byte, what one flow on the memory
store does; then two real ``prefixpin serve`` processes on the cluster."""

from __future__ import annotations

import asyncio
import inspect
import secrets
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import tests.canonicalize.test_recall as recall_scenarios
from benchmarks import bench_agents
from canonicalize import Settings, match
from proxy.config import Config, from_mapping, load
from proxy.offline import Offline, Replayed
from proxy.store.redis import RedisStore
from tests.agents.capture import AGENTS
from tests.agents.capture import load as load_agent
from tests.conftest import Recorder, track
from tests.e2e.test_redis_topologies import acl_user, as_user
from tests.flows import Harness
from tests.infra import unknown_agents as ua
from tests.infra.redis_topologies import Cluster

pytestmark = pytest.mark.e2e


def _new_id() -> str:
    return secrets.token_hex(8)  # prefixpin's shape: homed by the request flow


class Pair(Harness):
    """Two request flows on the cluster taking turns, request by request: two
    processes of prefixpin, each with its own canonicalizer and store client."""

    def __init__(self, cluster: Cluster, settings: Settings | None = None, config: Config | None = None) -> None:
        self.loop = asyncio.new_event_loop()  # the store clients' connections live on it
        cfg = config or load(None, env={})
        self.flows = [
            Offline(
                cfg,
                settings=settings,
                store=RedisStore(cluster.url, ttl_s=3600, timeout_s=5, mode="cluster", nodes=tuple(cluster.nodes)),
                new_id=_new_id,
            )
            for _ in range(2)
        ]
        self.offline, self.canon, self.sent = self.flows[0], self.flows[0].s.canon, 0

    def next(self) -> Offline:
        self.sent += 1
        return self.flows[(self.sent - 1) % 2]

    def run(self, coro: Coroutine[Any, Any, Replayed]) -> Replayed:
        return self.loop.run_until_complete(coro)

    def through(self, lines: Sequence[dict[str, Any]], replies: Callable[[dict[str, Any]], Any]) -> list[Replayed]:
        """Trace lines (tests.infra.unknown_agents', tests/agents') in turns."""
        out = []
        for line in lines:
            exchange = match(line["path"])
            assert exchange is not None
            send = self.next().send(line["body"], exchange=exchange, headers=line["headers"], reply=replies(line))
            out.append(self.run(send))
        return out

    def close(self) -> None:
        for flow in self.flows:
            self.loop.run_until_complete(flow.s.store.close())
        self.loop.close()


@pytest.fixture
def pairs(redis_cluster: Cluster) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(settings: Settings | None = None, config: Config | None = None) -> Pair:
        made.append(Pair(redis_cluster, settings, config))
        return made[-1]

    yield make
    for pair in made:
        pair.close()
    redis_cluster.flush()


def _same(memory: Sequence[Replayed], cluster: Sequence[Replayed]) -> None:
    """The same bytes upstream, roles and rewrites, request by request."""
    assert [f.role for f in cluster] == [f.role for f in memory]
    assert [f.rewrites for f in cluster] == [f.rewrites for f in memory]
    assert [f.out for f in cluster] == [f.out for f in memory]


# The scenarios of tests/canonicalize/test_recall.py that drive the flow, on the cluster.
SCENARIOS = sorted(
    name
    for name, test in vars(recall_scenarios).items()
    if name.startswith("test_") and "harness(" in inspect.getsource(test)
)


@pytest.mark.parametrize("name", SCENARIOS)
def test_recall_scenarios_on_a_cluster(name: str, pairs: Callable[..., Pair], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each scenario of learned.history and of a resumed first message (its stem and
    template lines marked in the tenant's slot, the lineage in its first message's home,
    the resumed conversation's next turn looked up in its own), its requests alternating
    between two flows on the cluster."""
    monkeypatch.setattr(recall_scenarios, "harness", lambda mode="pin": pairs(Settings(learn=mode)))
    test = getattr(recall_scenarios, name)
    test(**({"monkeypatch": monkeypatch} if "monkeypatch" in inspect.signature(test).parameters else {}))


def test_evidence_is_shared_by_two_processes_on_a_cluster(pairs: Callable[..., Pair]) -> None:
    """Agents no pack knows, three sessions on three wire APIs: a counter is pinned once
    its line changed twice, whichever process saw each change."""
    lines = ua.generate(ua.Spec(sessions=3, turns=8, seed=11))
    config = from_mapping({"canonicalize": {"learn": "pin"}, "tenancy": {"anonymous": "shared"}})
    memory = asyncio.run(ua.run(lines, config))
    cluster = pairs(config=config).through(lines, ua.replayed)
    _same(memory, cluster)
    assert any("learned.counter" in f.rewrites for f in cluster)


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_captured_agents_on_a_cluster(agent: str, pairs: Callable[..., Pair]) -> None:
    """Real agents' traffic (tests/agents/data): qwen-code's resumed session gets its
    first message as recorded (learned.history) and, the next day, its startup date
    pinned (learned.date); aider's date too."""
    lines = load_agent(agent)
    memory = asyncio.run(bench_agents.through(lines, "pin"))
    cluster = pairs(Settings(learn="pin")).through(lines, lambda line: line.get("response"))
    _same(memory, cluster)
    learned = {name for f in cluster for name in f.rewrites}
    assert "learned.date" in learned
    if agent == "qwen-code":
        assert "learned.history" in learned


def _drive(bases: Sequence[str], recorder: Recorder, lines: Sequence[dict[str, Any]]) -> list[httpx.Response]:
    """Each line to the next process, the recorder answering with the line's reply."""
    clients = [track(httpx.Client(base_url=b, trust_env=False, timeout=30)) for b in bases]
    out = []
    for i, line in enumerate(lines):
        recorder.control(**_reply(line))
        resp = clients[i % len(clients)].post(line["path"], json=line["body"], headers=line["headers"])
        assert resp.status_code == 200, resp.text
        resp.read()
        out.append(resp)
    return out


def _reply(line: dict[str, Any]) -> dict[str, Any]:
    resp = line["response"]
    if resp.get("tool_calls"):
        call = resp["tool_calls"][0]["function"]
        return {"tool_calls": [{"name": call["name"], "arguments": call["arguments"]}]}
    if "output" in resp:
        return {"content": resp["output"][0]["content"][0]["text"]}
    content = resp["content"]
    return {"content": content if isinstance(content, str) else content[0]["text"]}


def test_two_serve_processes_on_a_cluster_learn_as_one_on_memory(
    serve: Callable[..., str],
    recorder: Recorder,
    write_config: Callable[[dict[str, Any]], Path],
    redis_cluster: Cluster,
) -> None:
    """The learning trace of tests/e2e/test_learning.py, once through one ``serve`` on
    the memory store, once through two on the cluster taking turns: the upstream
    receives the same bytes, and the same rewrites are named (the cluster as the
    least-privilege ACL user of docs/deploy.md)."""
    lines = ua.generate(ua.Spec(sessions=2, turns=5, seed=5))
    one = serve(recorder.base, write_config({"canonicalize": {"learn": "pin"}}))
    alone = _drive([one], recorder, lines)
    single = [r["body"] for r in recorder.requests()]
    recorder.reset()
    redis_cluster.flush()
    acl_user(redis_cluster.ports)  # learning's scripts and reads as the least-privilege user
    store = {"backend": "redis", "redis_url": as_user(redis_cluster.url), "redis_mode": "cluster"}
    config = write_config({"canonicalize": {"learn": "pin"}, "store": {**store, "redis_nodes": redis_cluster.nodes}})
    spread = _drive([serve(recorder.base, config), serve(recorder.base, config)], recorder, lines)
    assert [r["body"] for r in recorder.requests()] == single
    for header in ("x-prefixpin-role", "x-prefixpin-rewrites"):
        assert [r.headers.get(header) for r in spread] == [r.headers.get(header) for r in alone]
    assert any("learned.counter" in r.headers.get("x-prefixpin-rewrites", "") for r in spread)
    redis_cluster.flush()
