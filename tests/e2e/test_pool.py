"""``upstream.pool`` against two real llama-server replicas behind ``prefixpin serve``,
driven by the openai SDK (no retries: a failed request fails the test).

(i)   a lineage's turns all go to one replica, which serves its later turns from cache;
(ii)  a replica SIGKILLed: no request fails, its lineages move, /readyz names it;
(iii) two prefixpin processes on one redis-server route a lineage to the same replica,
      turn by turn alternating between them, and also after one of them moved the
      lineage (failover) while the other never saw its old replica fail: the replica
      is in the lineage's record, which both read with the lineage itself.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from benchmarks.bench_cache import _metric_sums
from tests import hermes
from tests.conftest import track
from tests.infra.procs import Proc, start_llama

pytestmark = pytest.mark.e2e

Replicas = list[tuple[Proc, str]]


@pytest.fixture
def replicas(log_dir: Path) -> Iterator[Replicas]:
    """Two llama-server replicas of one model (one thread each: they share 2 cores)."""
    started: Replicas = []
    try:
        for i in range(2):
            started.append(start_llama(log_dir, threads=1, name=f"llama-pool-{i}-{time.monotonic_ns()}"))
        yield started
    finally:
        for proc, _ in started:
            proc.stop()


def _pool_config(write_config: Callable[[dict[str, Any]], Path], bases: list[str], **affinity: Any) -> Path:
    return write_config({"upstream": {"pool": bases}, "affinity": affinity})


def _client(base: str) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key="sk-e2e-pool", max_retries=0, timeout=120))


class Conversation:
    """One agent session: the hermes system prompt, its history growing by the replies."""

    def __init__(self, session: str) -> None:
        self.system = hermes.system_prompt(session=session)
        self.history: list[dict[str, Any]] = []

    def turn(self, client: openai.OpenAI, text: str) -> tuple[Any, httpx.Headers]:
        self.history.append({"role": "user", "content": text})
        messages = [{"role": "system", "content": self.system}, *self.history]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, tools=hermes.tools_full(), max_tokens=3
        )
        completion = raw.parse()
        self.history.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        return completion, raw.headers


def _cached(completion: Any) -> int:
    details = completion.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


def _prompt_tokens_seen(base: str) -> float:
    text = httpx.get(base + "/metrics", trust_env=False, timeout=10).text
    return _metric_sums(text, ("llamacpp:prompt_tokens_total",))["llamacpp:prompt_tokens_total"]


def _session(i: int) -> str:
    return f"20260513_2045{i:02d}_{i:06x}"


def test_i_a_lineage_stays_on_one_replica_and_hits_its_cache(
    replicas: Replicas, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    bases = [b for _, b in replicas]
    proxy = serve(bases[0], _pool_config(write_config, bases))
    client = _client(proxy)
    conv = Conversation(_session(1))
    turns = [conv.turn(client, f"Step {i}: list the files again.") for i in range(3)]
    homes = {h["x-prefixpin-replica"] for _, h in turns}
    assert len(homes) == 1, homes
    assert [h["x-prefixpin-role"] for _, h in turns] == ["root", "continuation", "continuation"]
    for completion, _ in turns[1:]:
        # everything up to the new user message was this replica's previous prompt
        assert _cached(completion) >= 0.9 * completion.usage.prompt_tokens - 40, completion.usage
    home = int(homes.pop())
    assert _prompt_tokens_seen(bases[1 - home]) == 0  # the other replica never got a prompt


def test_ii_a_killed_replica_loses_no_request_and_its_lineages_move(
    replicas: Replicas, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    bases = [b for _, b in replicas]
    proxy = serve(bases[0], _pool_config(write_config, bases))
    client = _client(proxy)
    convs: list[tuple[Conversation, int]] = []
    for i in range(20):  # lineage ids are random: enough sessions to have both replicas home to one
        conv = Conversation(_session(i))
        _, headers = conv.turn(client, "What changed since yesterday?")
        convs.append((conv, int(headers["x-prefixpin-replica"])))
        if len({home for _, home in convs}) == 2 and len(convs) >= 4:
            break
    assert {home for _, home in convs} == {0, 1}
    dead = convs[0][1]
    replicas[dead][0].stop(signal.SIGKILL)
    for conv, home in convs:
        completion, headers = conv.turn(client, "And now?")  # raises on any failure
        assert headers["x-prefixpin-role"] == "continuation"
        assert int(headers["x-prefixpin-replica"]) == (1 - dead if home == dead else home)
        if home == dead:  # moved: it stays, and its next turn hits the survivor's cache
            # (right away: each replica has one slot, the next lineage takes it)
            completion, headers = conv.turn(client, "Once more.")
            assert int(headers["x-prefixpin-replica"]) == 1 - dead
            assert _cached(completion) > 0.5 * completion.usage.prompt_tokens, completion.usage
    ready = httpx.get(proxy + "/readyz", trust_env=False, timeout=10)
    assert ready.status_code == 200  # one replica answers
    assert [r["ok"] for r in ready.json()["replicas"]] == [i != dead for i in range(2)]
    metrics = httpx.get(proxy + "/metrics", trust_env=False, timeout=10).text
    failovers = _metric_sums(metrics, ("prefixpin_replica_failovers_total",))["prefixpin_replica_failovers_total"]
    assert failovers >= 1


def _wait_recorded() -> None:
    time.sleep(0.5)  # a lineage is recorded just after its response, off the request's path


def test_iii_two_processes_on_one_redis_route_a_lineage_alike(
    replicas: Replicas, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path], redis_url: str
) -> None:
    bases = [b for _, b in replicas]
    config = _pool_config(write_config, bases)
    env = {"PREFIXPIN_REDIS_URL": redis_url}
    clients = [_client(serve(bases[0], config, env=env)), _client(serve(bases[0], config, env=env))]
    for s in range(3):
        conv = Conversation(_session(40 + s))
        got = []
        for t in range(4):  # the turns alternate between the two processes
            completion, headers = conv.turn(clients[t % 2], f"Turn {t}.")
            got.append((headers["x-prefixpin-role"], headers["x-prefixpin-lineage"], headers["x-prefixpin-replica"]))
            if t:
                assert _cached(completion) > 0.5 * completion.usage.prompt_tokens, (t, completion.usage)
            _wait_recorded()
        assert [r for r, _, _ in got] == ["root", "continuation", "continuation", "continuation"]
        assert len({lineage for _, lineage, _ in got}) == 1
        assert len({replica for _, _, replica in got}) == 1, got


def test_iii_a_lineage_one_process_moved_is_followed_by_the_other(
    log_dir: Path,
    replicas: Replicas,
    serve: Callable[..., str],
    write_config: Callable[[dict[str, Any]], Path],
    redis_url: str,
) -> None:
    """A fails the lineage over while its home is down; the home comes back on its port,
    so B's hash ring still points there.  B follows the record to where the prefix is."""
    bases = [b for _, b in replicas]
    config = _pool_config(write_config, bases, retry_after_s=0.5)
    env = {"PREFIXPIN_REDIS_URL": redis_url}
    a, b = _client(serve(bases[0], config, env=env)), _client(serve(bases[0], config, env=env))
    conv = Conversation(_session(77))
    _, first = conv.turn(a, "Turn 0.")
    home = int(first["x-prefixpin-replica"])
    _wait_recorded()
    replicas[home][0].stop(signal.SIGKILL)
    _, moved = conv.turn(a, "Turn 1.")
    assert int(moved["x-prefixpin-replica"]) == 1 - home
    _wait_recorded()
    port = int(bases[home].rsplit(":", 1)[1])
    replicas[home] = start_llama(log_dir, threads=1, port=port, name=f"llama-pool-back-{time.monotonic_ns()}")
    time.sleep(0.6)  # past retry_after_s: A would try the old home again too
    for client in (b, a):
        completion, headers = conv.turn(client, "Next turn.")
        assert headers["x-prefixpin-role"] == "continuation"
        assert int(headers["x-prefixpin-replica"]) == 1 - home
        assert _cached(completion) > 0.5 * completion.usage.prompt_tokens, completion.usage
        _wait_recorded()
    assert _prompt_tokens_seen(bases[home]) == 0  # the restarted replica got nothing
