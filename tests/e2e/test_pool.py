"""``upstream.pool`` against two real llama-server replicas behind ``prefixpin serve``,
driven by the openai SDK (no retries: a failed request fails the test).

(i)   a lineage's turns all go to one replica, which serves its later turns from cache;
(ii)  a replica SIGKILLed: no request fails, its lineages move, /readyz names it;
(iii) two prefixpin processes on one redis-server route a lineage to the same replica,
      turn by turn alternating between them, and also after one of them moved the
      lineage (failover) while the other never saw its old replica fail: the replica
      is in the lineage's record, which both read with the lineage itself;
(iv)  llama-server as users start it (its defaults), three interleaved sessions: on two
      replicas both serve (a new lineage goes where the load is least), each session
      stays on one, and as much is cached as on one replica; a replica SIGKILLed
      mid-run loses no request, and its sessions move and keep being cached.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from benchmarks.bench_cache import _metric_sums
from tests import hermes
from tests.conftest import track
from tests.infra import sessions
from tests.infra.procs import DEFAULTS, Proc, start_llama

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
    replicas[home][0].stop(signal.SIGKILL)
    _, moved = conv.turn(a, "Turn 1.")
    assert int(moved["x-prefixpin-replica"]) == 1 - home
    port = int(bases[home].rsplit(":", 1)[1])
    replicas[home] = start_llama(log_dir, threads=1, port=port, name=f"llama-pool-back-{time.monotonic_ns()}")
    # Kept on purpose: what must pass is time itself (retry_after_s, 0.5 s), after which A
    # would try the old home again too.
    time.sleep(0.6)
    for client in (b, a):
        completion, headers = conv.turn(client, "Next turn.")
        assert headers["x-prefixpin-role"] == "continuation"
        assert int(headers["x-prefixpin-replica"]) == 1 - home
        assert _cached(completion) > 0.5 * completion.usage.prompt_tokens, completion.usage
    assert _prompt_tokens_seen(bases[home]) == 0  # the restarted replica got nothing


# -- (iv) llama-server with its defaults, three sessions ----------------------------------
TURNS = 8


@pytest.fixture
def default_replicas(log_dir: Path) -> Iterator[Replicas]:
    """Two llama-server replicas as users start them (no --parallel, no --cache-ram)."""
    started: Replicas = []
    try:
        for i in range(2):
            name = f"llama-defaults-{i}-{time.monotonic_ns()}"
            started.append(start_llama(log_dir, threads=1, ctx=sessions.ctx_for(TURNS), name=name, **DEFAULTS))
        yield started
    finally:
        for proc, _ in started:
            proc.stop()


def _homes(sent: list[sessions.Sent]) -> dict[str, set[str]]:
    homes: dict[str, set[str]] = {}
    for s in sent:
        homes.setdefault(s.session, set()).add(s.headers["x-prefixpin-replica"])
    return homes


def test_iv_three_sessions_on_two_replicas_both_serve_and_stay_cached(
    log_dir: Path,
    default_replicas: Replicas,
    serve: Callable[..., str],
    write_config: Callable[[dict[str, Any]], Path],
) -> None:
    ids = sessions.session_ids(3)
    bases = [b for _, b in default_replicas]
    pooled = sessions.run(serve(bases[0], _pool_config(write_config, bases)), ids, TURNS)
    proc, one = start_llama(log_dir, ctx=sessions.ctx_for(TURNS), name=f"llama-one-{time.monotonic_ns()}", **DEFAULTS)
    try:
        single = sessions.run(serve(one), ids, TURNS)
    finally:
        proc.stop()
    homes = _homes(pooled)
    assert all(len(h) == 1 for h in homes.values()), homes
    served = Counter(s.headers["x-prefixpin-replica"] for s in pooled)
    assert min(served["0"], served["1"]) >= 0.2 * len(pooled), served
    assert [s.headers["x-prefixpin-role"] for s in pooled[:3]] == ["root"] * 3
    print(f"\ncached: pool of two {sessions.ratio(pooled):.3f}, one upstream {sessions.ratio(single):.3f}; {served}")
    assert sessions.ratio(pooled) >= 0.98 * sessions.ratio(single)


def test_iv_a_replica_killed_mid_run_loses_nothing(
    default_replicas: Replicas, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    ids = sessions.session_ids(3)
    bases = [b for _, b in default_replicas]
    proxy = serve(bases[0], _pool_config(write_config, bases))
    killed: list[int] = []

    def kill_midway(sent: sessions.Sent) -> None:
        if sent.turn == TURNS // 2 - 1 and sent.session == ids[-1]:  # after a whole round
            killed.append(int(sent.headers["x-prefixpin-replica"]))  # the last session's home
            default_replicas[killed[0]][0].stop(signal.SIGKILL)

    sent = sessions.run(proxy, ids, TURNS, after=kill_midway)  # raises on any failed request
    assert len(sent) == len(ids) * TURNS
    dead, after = str(killed[0]), [s for s in sent if s.turn >= TURNS // 2]
    assert all(s.headers["x-prefixpin-replica"] != dead for s in after)
    assert all(s.headers["x-prefixpin-role"] == "continuation" for s in after)
    moved = {s.session for s in sent if s.turn < TURNS // 2 and s.headers["x-prefixpin-replica"] == dead}
    assert moved and ids[-1] in moved
    for s in after:
        if s.turn > TURNS // 2:  # moved sessions too: cached on the survivor from their second turn there
            assert s.cached > 0.5 * s.prompt, s
    metrics = httpx.get(proxy + "/metrics", trust_env=False, timeout=10).text
    assert _metric_sums(metrics, ("prefixpin_replica_failovers_total",))["prefixpin_replica_failovers_total"] >= 1
