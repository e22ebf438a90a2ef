"""Section 2c in-process: a pool of fake replicas (one mock transport, told apart
by host), lineage routing and placement, failover only before any byte left,
id_slot as llama-server's /slots say, and affinity headers."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config import ConfigError, from_mapping
from proxy.store.memory import MemoryStore
from tests import hermes
from tests.infra.wait import wait_until

POOL = ["http://r0.test", "http://r1.test", "http://r2.test"]


class Replicas(httpx.AsyncBaseTransport):
    """Three fake replicas; bodies stream unread, as from the real transport.  Their
    ``/props`` and ``/slots`` answer 404 (not a llama-server) unless ``slots`` holds
    what ``/slots`` should answer (then ``/props`` says ``total_slots``).  A probe
    (``POST /completion`` naming ``id_slot``) is kept in ``probes`` and runs as
    llama-server would when ``server`` says how it keeps prompts (``keeps`` or
    ``clears``); otherwise ``/slots`` stay as set."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, httpx.Headers]] = []
        self.refuse: set[str] = set()
        self.reset: set[str] = set()
        self.slots: list[dict[str, Any]] | None = None
        self.total_slots = 4
        self.reads = 0
        self.probes: list[dict[str, Any]] = []
        self.server: str | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.refuse:
            raise httpx.ConnectError("refused")
        if request.url.path in ("/props", "/slots"):
            self.reads += request.url.path == "/slots"
            if self.slots is None:
                return httpx.Response(404, json={"error": "not found"})
            if request.url.path == "/props":
                return httpx.Response(200, json={"total_slots": self.total_slots})
            return httpx.Response(200, json=self.slots)
        if request.url.path == "/completion" and self.slots is not None:
            probe = orjson.loads(await request.aread())
            self.probes.append(probe)
            self._run(probe["id_slot"])
            return httpx.Response(200, json={"content": "x"})
        self.seen.append((host, await request.aread(), request.headers))
        if host in self.reset:
            raise httpx.ReadError("reset after the request was written")
        body: Any = {"status": "ok"}
        if request.url.path != "/health":
            message = {"role": "assistant", "content": "ok"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            body = {"id": "c", "object": "chat.completion", "choices": [choice], "usage": {"prompt_tokens": 10}}
        headers = {"content-type": "application/json"}
        return httpx.Response(200, headers=headers, stream=httpx.ByteStream(orjson.dumps(body)))

    def _run(self, slot: int) -> None:
        assert self.slots is not None
        if self.server is None:
            return
        task = 1 + max((s.get("id_task", -1) for s in self.slots), default=-1)
        for s in self.slots:
            if s["id"] == slot:
                s |= {"id_task": task, "n_prompt_tokens": 9}
            elif self.server == "clears" and "id_task" in s:
                s["n_prompt_tokens"] = 0  # saved to the RAM cache and cleared


def _client(up: Replicas, **affinity: Any) -> TestClient:
    cfg = from_mapping({"upstream": {"pool": POOL}, "affinity": affinity})
    return TestClient(create_app(cfg, transport=up), headers={"authorization": "Bearer sk-test"})


def _turns(session: str, n: int) -> list[dict[str, Any]]:
    system = f"You are a careful coding agent. Session {session}."
    history: list[dict[str, Any]] = []
    out = []
    for i in range(n):
        history = [*history, {"role": "user", "content": f"question {i} of {session}"}]
        out.append(hermes.request(system, history))
        history = [*history, {"role": "assistant", "content": "ok"}]
    return out


def _metric(client: TestClient, line: str) -> float:
    return float(next(x for x in client.get("/metrics").text.splitlines() if x.startswith(line)).split()[-1])


def test_a_lineage_stays_on_one_replica_and_sessions_spread() -> None:
    up = Replicas()
    with _client(up) as client:
        homes = set()
        for s in range(8):
            replicas = set()
            for body in _turns(f"s{s}", 3):
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
                replicas.add(r.headers["x-prefixpin-replica"])
            assert len(replicas) == 1, replicas
            homes |= replicas
        assert len(homes) > 1
        assert sum(_metric(client, f'prefixpin_replica_requests_total{{replica="{i}"}}') for i in range(3)) == 24


def test_refused_replica_fails_over_once_and_is_skipped() -> None:
    up = Replicas()
    with _client(up) as client:
        first = client.post("/v1/chat/completions", json=_turns("a", 1)[0])
        home = int(first.headers["x-prefixpin-replica"])
        up.refuse.add(f"r{home}.test")
        r = client.post("/v1/chat/completions", json=_turns("a", 2)[1])
        assert r.status_code == 200 and r.headers["x-prefixpin-replica"] != str(home)
        assert _metric(client, "prefixpin_replica_failovers_total") == 1
        ready = client.get("/readyz").json()
        assert ready["status"] == "ready"
        assert [x["ok"] for x in ready["replicas"]] == [i != home for i in range(3)]


def test_a_request_written_to_a_replica_is_never_resent() -> None:
    up = Replicas()
    with _client(up) as client:
        home = client.post("/v1/chat/completions", json=_turns("b", 1)[0]).headers["x-prefixpin-replica"]
        up.reset.add(f"r{home}.test")
        before = len(up.seen)
        r = client.post("/v1/chat/completions", json=_turns("b", 2)[1])
        assert r.status_code == 502
        assert len(up.seen) == before + 1
        assert _metric(client, "prefixpin_replica_failovers_total") == 0


def test_new_lineages_go_where_the_load_is_least() -> None:
    """Three sessions on two replicas, turns interleaved: both replicas serve (placed by
    load, not by where the hash of a few random ids happens to fall), each session stays."""
    up = Replicas()
    cfg = from_mapping({"upstream": {"pool": POOL[:2]}})
    with TestClient(create_app(cfg, transport=up), headers={"authorization": "Bearer sk-test"}) as client:
        sessions = {s: _turns(s, 3) for s in ("x", "y", "z")}
        homes: dict[str, set[str]] = {s: set() for s in sessions}
        for t in range(3):
            for s, turns in sessions.items():
                r = client.post("/v1/chat/completions", json=turns[t])
                assert r.headers["x-prefixpin-role"] == ("root" if t == 0 else "continuation")
                homes[s].add(r.headers["x-prefixpin-replica"])
        assert all(len(h) == 1 for h in homes.values()), homes
        assert sorted(Counter(h.pop() for h in homes.values()).values()) == [1, 2]


def test_llama_slots_add_id_slot_and_keep_every_other_byte() -> None:
    up = Replicas()
    with _client(up, llama_slots=2) as client:
        slots = {}
        for s in ("a", "b", "c"):
            for body in _turns(s, 2):
                raw = orjson.dumps(body)
                r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
                sent = up.seen[-1][1]
                assert sent == raw[:-1] + b',"id_slot":' + r.headers["x-prefixpin-slot"].encode() + b"}"
                slots.setdefault(s, set()).add(r.headers["x-prefixpin-slot"])
        assert all(len(v) == 1 for v in slots.values())
        assert slots["a"] != slots["b"] and slots["c"] == slots["a"]  # LRU: c took a's slot


def test_affinity_headers_replace_the_clients_own() -> None:
    up = Replicas()
    with _client(up, headers=["x-session-affinity"]) as client:
        r = client.post("/v1/chat/completions", json=_turns("h", 1)[0], headers={"X-Session-Affinity": "client-chosen"})
        sent = up.seen[-1][2]
        assert sent.get_list("x-session-affinity") == [r.headers["x-prefixpin-lineage"]]


def test_passthrough_goes_round_robin() -> None:
    up = Replicas()
    with _client(up) as client:
        got = [client.get("/v1/models").headers["x-prefixpin-replica"] for _ in range(3)]
        assert sorted(got) == ["0", "1", "2"]


# -- the replica that served a lineage is recorded with it, and preferred -----------------
RETRY_S = 0.01  # affinity.retry_after_s of these tests


def _past_retry_after(refused_before: float) -> None:
    """Until a replica refused before ``refused_before`` (time.monotonic) is healthy
    again: the pool marks it down until its clock (time.monotonic, not injectable
    through create_app) reads the refusal's time plus retry_after_s."""
    wait_until(lambda: time.monotonic() >= refused_before + RETRY_S, interval=0.001, message="past retry_after_s")


def _settle(client: TestClient) -> None:
    """Wait until the records of the requests so far are written (they are written
    after the response, off the request's path)."""
    app: Any = client.app
    assert client.portal is not None
    client.portal.call(app.state.services.drain)


def test_a_lineage_moved_by_failover_stays_where_it_moved() -> None:
    up = Replicas()
    turns = _turns("m", 3)
    with _client(up, retry_after_s=RETRY_S) as client:
        home = client.post("/v1/chat/completions", json=turns[0]).headers["x-prefixpin-replica"]
        _settle(client)
        up.refuse.add(f"r{home}.test")
        moved = client.post("/v1/chat/completions", json=turns[1]).headers["x-prefixpin-replica"]
        refused = time.monotonic()
        assert moved != home
        _settle(client)
        up.refuse.clear()
        _past_retry_after(refused)  # the old home is healthy again
        r = client.post("/v1/chat/completions", json=turns[2])
        assert r.headers["x-prefixpin-role"] == "continuation"
        assert r.headers["x-prefixpin-replica"] == moved  # its prefix is cached there now


def test_processes_sharing_a_store_follow_a_diverted_lineage() -> None:
    """Process A's failover moved the lineage; B never saw the refusal and its hash
    still points at the old home, but B reads the replica in the lineage's record."""
    up = Replicas()
    store = MemoryStore(ttl_s=600)
    cfg = from_mapping({"upstream": {"pool": POOL}, "affinity": {"retry_after_s": RETRY_S}})
    auth = {"authorization": "Bearer sk-test"}
    a = TestClient(create_app(cfg, transport=up, store=store), headers=auth)
    b = TestClient(create_app(cfg, transport=up, store=store), headers=auth)
    turns = _turns("shared", 4)
    with a, b:
        home = a.post("/v1/chat/completions", json=turns[0]).headers["x-prefixpin-replica"]
        _settle(a)
        up.refuse.add(f"r{home}.test")
        moved = a.post("/v1/chat/completions", json=turns[1]).headers["x-prefixpin-replica"]
        refused = time.monotonic()
        _settle(a)
        up.refuse.clear()  # B never saw it refuse; A retries it after retry_after_s
        _past_retry_after(refused)
        got = []
        for client, body in ((b, turns[2]), (a, turns[3])):
            r = client.post("/v1/chat/completions", json=body)
            assert r.headers["x-prefixpin-role"] == "continuation"
            got.append(r.headers["x-prefixpin-replica"])
            _settle(client)
        assert moved != home and got == [moved, moved]


def test_a_fork_goes_to_its_parents_recorded_replica() -> None:
    up = Replicas()
    system = hermes.system_prompt()
    history: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    with _client(up, retry_after_s=RETRY_S) as client:
        home = client.post("/v1/chat/completions", json=hermes.request(system, history, hermes.tools_full()))
        _settle(client)
        up.refuse.add(f"r{home.headers['x-prefixpin-replica']}.test")
        history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "And the tests?"}]
        moved = client.post("/v1/chat/completions", json=hermes.request(system, history, hermes.tools_full()))
        refused = time.monotonic()
        _settle(client)
        up.refuse.clear()
        _past_retry_after(refused)
        review = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Review it."}]
        fork = client.post(
            "/v1/chat/completions", json=hermes.request(hermes.system_prompt(), review, hermes.tools_review())
        )
        assert fork.headers["x-prefixpin-role"] == "fork"
        assert fork.headers["x-prefixpin-replica"] == moved.headers["x-prefixpin-replica"]
        assert moved.headers["x-prefixpin-replica"] != home.headers["x-prefixpin-replica"]


# -- llama_slots follows what llama-server does with its slots ------------------------------
def _slots(*held: tuple[int | None, int]) -> list[dict[str, Any]]:
    """``/slots`` of idle slots: per slot (id_task or None, n_prompt_tokens)."""
    out: list[dict[str, Any]] = []
    for i, (task, tokens) in enumerate(held):
        item: dict[str, Any] = {"id": i, "n_ctx": 8192, "is_processing": False}
        if task is not None:
            item |= {"id_task": task, "n_prompt_tokens": tokens}
        out.append(item)
    return out


def _read_slots(client: TestClient) -> str:
    """Read the servers' /slots now (the app reads them in the background); the plan's mode."""
    app: Any = client.app
    assert client.portal is not None
    watch = app.state.services.slots
    return str(client.portal.call(watch.read).mode)


def _slot(client: TestClient, body: dict[str, Any]) -> str | None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    return r.headers.get("x-prefixpin-slot")


def _one_replica(up: Replicas, **affinity: Any) -> TestClient:
    cfg = from_mapping({"upstream": {"url": POOL[0]}, "affinity": affinity})
    return TestClient(create_app(cfg, transport=up), headers={"authorization": "Bearer sk-test"})


def test_a_server_that_clears_idle_slots_is_never_pinned() -> None:
    """llama-server's defaults: unknown at first (a fresh server), so only a new lineage
    and the lineage just served are pinned; once an idle slot is seen emptied, none."""
    up = Replicas()
    up.slots = _slots((None, 0), (None, 0), (None, 0), (None, 0))
    a, b, c = _turns("a", 4), _turns("b", 2), _turns("c", 1)
    with _one_replica(up, llama_slots=4) as client:
        assert _read_slots(client) == "careful"
        assert [_slot(client, a[0]), _slot(client, a[1]), _slot(client, b[0])] == ["0", "0", "1"]
        assert _slot(client, a[2]) is None  # b was sent since: a's slot may have been emptied
        assert b'"id_slot"' not in up.seen[-1][1]
        up.slots = _slots((30, 0), (21, 3900), (None, 0), (None, 0))  # slot 0 emptied when b started
        assert _read_slots(client) == "none"
        why = client.get("/readyz").json()["llama_slots"]
        assert why["pinning"] == "none" and why["slots"] == 4 and "clears idle slots" in why["why"]
        assert [_slot(client, b[1]), _slot(client, a[3]), _slot(client, c[0])] == [None, None, None]
        assert all(b'"id_slot"' not in body for _, body, _ in up.seen[-3:])


def test_a_server_whose_slots_keep_their_prompts_is_pinned() -> None:
    """Fixed slots without the RAM cache: a slot kept its prompt while idle as another
    task started; from then on every lineage is pinned, as configured."""
    up = Replicas()
    up.slots = _slots((0, 3500), (None, 0), (None, 0))
    up.total_slots = 3
    with _one_replica(up, llama_slots="auto") as client:
        assert _read_slots(client) == "careful"
        up.slots = _slots((0, 3500), (11, 3600), (None, 0))
        assert _read_slots(client) == "all"
        got = {s: {_slot(client, body) for body in _turns(s, 2)} for s in ("a", "b", "c", "d")}
        assert got == {"a": {"0"}, "b": {"1"}, "c": {"2"}, "d": {"0"}}  # auto: /props' 3 slots, LRU


@pytest.mark.parametrize(("server", "mode"), [("clears", "none"), ("keeps", "all")])
def test_a_fresh_server_is_probed_before_the_first_request(server: str, mode: str) -> None:
    """Every slot empty: reading cannot tell, so two one-token completions (slot 0, then
    slot 1) do, before the first request is placed; a server that ran tasks is not probed."""
    up = Replicas()
    up.slots = _slots((None, 0), (None, 0), (None, 0), (None, 0))
    up.server = server
    with _one_replica(up, llama_slots="auto") as client:
        first = _slot(client, _turns("a", 1)[0])
        assert [p["id_slot"] for p in up.probes] == [0, 1]
        assert all(p["n_predict"] == 1 for p in up.probes)
        assert client.get("/readyz").json()["llama_slots"]["pinning"] == mode
        assert first == ("0" if mode == "all" else None)
        assert _read_slots(client) == mode
        assert len(up.probes) == 2  # once per server
    busy = Replicas()
    busy.slots = _slots((4, 300), (None, 0))
    busy.server = "clears"
    with _one_replica(busy, llama_slots=2) as client:
        _read_slots(client)
        assert busy.probes == []


def test_auto_without_slots_to_read_pins_nothing() -> None:
    up = Replicas()  # /props and /slots: 404
    with _one_replica(up, llama_slots="auto") as client:
        assert _read_slots(client) == "none"
        assert _slot(client, _turns("a", 1)[0]) is None


def test_slots_are_read_after_responses_off_the_request_path() -> None:
    up = Replicas()
    up.slots = _slots((None, 0), (None, 0))
    with _one_replica(up, llama_slots=2) as client:
        deadline = time.monotonic() + 5
        while up.reads < 1 and time.monotonic() < deadline:  # the read at start
            time.sleep(0.01)
        before = up.reads
        _slot(client, _turns("a", 1)[0])
        while up.reads == before and time.monotonic() < deadline:  # one after the response
            time.sleep(0.01)
        assert up.reads > before


def test_careful_pinning_counts_what_it_did_not_route() -> None:
    """Not yet known: a lineage goes back to its slot only when nothing else was sent
    since its last request, a passthrough completion included (it ran on some slot)."""
    up = Replicas()
    up.slots = _slots((None, 0), (None, 0))
    a = _turns("a", 3)
    with _one_replica(up, llama_slots=2) as client:
        assert _read_slots(client) == "careful"
        assert [_slot(client, a[0]), _slot(client, a[1])] == ["0", "0"]
        client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1})
        assert _slot(client, a[2]) is None


def test_llama_slots_takes_auto_a_count_or_off() -> None:
    assert from_mapping({"affinity": {"llama_slots": "auto"}}).affinity.llama_slots == "auto"
    assert from_mapping({"affinity": {"llama_slots": 4}}).affinity.llama_slots == 4
    assert from_mapping({}).affinity.llama_slots == 0
    for bad in ("many", -1, True, 2.5):
        with pytest.raises(ConfigError, match=r"affinity\.llama_slots: must be auto, 0"):
            from_mapping({"affinity": {"llama_slots": bad}})
    with pytest.raises(ConfigError, match=r"listen\.workers: must be 1"):
        from_mapping({"affinity": {"llama_slots": "auto"}, "listen": {"workers": 2}, "store": {"backend": "redis"}})
