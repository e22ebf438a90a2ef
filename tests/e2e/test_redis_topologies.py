"""prefixpin on the Redis that teams run (SPEC section 2g), every server real and
started by the test: a Redis Cluster of 3 masters and 3 replicas (a master killed
mid-conversation), a Sentinel group (a failover), an ACL user over TLS, data lost
under a running prefixpin, and what the store costs Redis per request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import Recorder
from tests.infra.agent_trace import Conversation, Talk, trace
from tests.infra.procs import Proc, closed_port, free_port, redis_server_path
from tests.infra.redis_topologies import Cluster, SentinelGroup, info, start_cluster, start_sentinel_group
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

Serve = Callable[..., str]
Config = Callable[[dict[str, Any]], Path]


def _store(url: str, **more: Any) -> dict[str, Any]:
    return {"store": {"backend": "redis", "redis_url": url, **more}}


def _cluster_config(cluster: Cluster) -> dict[str, Any]:
    return _store(cluster.url, redis_mode="cluster", redis_nodes=cluster.nodes)


def _ready(base: str) -> httpx.Response:
    return httpx.get(base + "/readyz", trust_env=False, timeout=10)


def _fail_open(base: str) -> float:
    text = httpx.get(base + "/metrics", trust_env=False).text
    line = next((ln for ln in text.splitlines() if ln.startswith('prefixpin_fail_open_total{stage="store"}')), None)
    return float(line.split()[-1]) if line else 0.0


@pytest.fixture
def own_cluster(log_dir: Path) -> Iterator[Cluster]:
    """A cluster this test may break."""
    cluster = start_cluster(log_dir)
    yield cluster
    cluster.stop()


@pytest.fixture
def sentinels(log_dir: Path) -> Iterator[SentinelGroup]:
    group = start_sentinel_group(log_dir)
    yield group
    group.stop()


def test_several_processes_on_a_cluster_forward_what_one_on_standalone_does(
    serve: Serve, write_config: Config, recorder: Recorder, redis_url: str, redis_cluster: Cluster
) -> None:
    """The same trace, once through one prefixpin on one redis-server and once through
    three on the cluster (each request to the next process): the same roles, and the
    upstream receives the same bytes."""
    one = serve(recorder.base, config=write_config(_store(redis_url)))
    alone = trace(Talk([one]))
    single = recorder.bodies()
    recorder.reset()
    redis_cluster.flush()
    acl_user(redis_cluster.ports)  # the cluster as an ACL user
    config = write_config(_store(as_user(redis_cluster.url), redis_mode="cluster", redis_nodes=redis_cluster.nodes))
    bases = [serve(recorder.base, config=config) for _ in range(3)]
    spread = trace(Talk(bases))
    assert spread == alone
    assert {"root", "continuation", "fork"} <= set(alone) and "fail-open" not in alone
    assert recorder.bodies() == single
    assert all(_ready(b).status_code == 200 for b in bases)


def test_a_cluster_master_killed_mid_conversation(
    serve: Serve, write_config: Config, recorder: Recorder, own_cluster: Cluster
) -> None:
    base = serve(recorder.base, config=write_config(_cluster_config(own_cluster)))
    talk = Talk([base])
    convs = [Conversation(n) for n in range(6)]
    for c in convs:
        talk.turn(c)
        talk.turn(c)
    assert set(talk.roles) == {"root", "continuation"}
    victim = own_cluster.master_ports()[0]
    own_cluster.kill(victim)
    # Until a replica is promoted, /readyz names the shard that takes no writes.
    reason = _ready(base)
    if reason.status_code == 503:
        assert "cluster" in reason.text and str(victim) in reason.text
    wait_until(lambda: _ready(base).status_code == 200, timeout=30, interval=0.3, message="the replica promoted")
    wait_until(own_cluster.ok, timeout=30, interval=0.2, message="the cluster ok again")
    before = len(talk.roles)
    for c in convs:
        talk.turn(c)
    after = talk.roles[before:]
    assert after == ["continuation"] * len(convs), after  # every conversation continues, none fails open
    fork = talk.fork(convs[0])
    assert fork == "fork"


def test_a_sentinel_failover_is_followed(
    serve: Serve, write_config: Config, recorder: Recorder, sentinels: SentinelGroup
) -> None:
    acl_user([sentinels.master, *sentinels.replicas])  # the data nodes' user; the Sentinels have none
    url = as_user(sentinels.url)
    config = _store(url, redis_mode="sentinel", redis_nodes=sentinels.nodes, sentinel_master=sentinels.name)
    base = serve(recorder.base, config=write_config(config))
    talk = Talk([base])
    c = Conversation(0)
    wait_until(lambda: talk.turn(c) != "fail-open", timeout=15, interval=0.2, message="looked up again")
    assert talk.turn(c) == "continuation"
    old = sentinels.current_master()
    new = sentinels.failover()
    assert new != old
    # The demoted master answers READONLY; prefixpin asks the Sentinels again.
    wait_until(lambda: talk.turn(c) == "continuation", timeout=30, interval=0.3, message="a turn on the new master")
    assert talk.turn(c) == "continuation"
    assert talk.fork(c) == "fork"
    assert _ready(base).status_code == 200
    assert info(new, "replication")["role"] == "master"


# The least privilege prefixpin needs (docs/deploy.md): its keys, the commands it and
# its scripts send, and what a cluster client reads of the cluster (its slots, the
# commands' key positions, ASKING during a resharding).  One line for every mode.
ACL = (
    "user prefixpin on >{password} ~pp:* resetchannels -@all +evalsha +eval +get +set +del +hget +hmget"
    " +hset +hsetnx +hdel +hincrby +hkeys +expire +zadd +zrange +zrem +ping +cluster|slots +command +asking"
)
PASSWORD = "s3cret-for-the-test"


def acl_user(ports: list[int]) -> None:
    """The ACL line on each server (ACL rules are not replicated)."""
    from tests.infra.redis_topologies import ask

    rules = ACL.format(password=PASSWORD).split(" ", 2)[2].split()
    for port in ports:
        ask(port, "ACL", "SETUSER", "prefixpin", "reset", *rules)


def as_user(url: str) -> str:
    return url.replace("redis://", f"redis://prefixpin:{PASSWORD}@", 1)


def test_an_acl_user_over_tls(
    serve: Serve, write_config: Config, recorder: Recorder, log_dir: Path, tmp_path: Path
) -> None:
    """The least-privilege ACL line of docs/deploy.md, over rediss:// with a private CA."""
    from tests.infra import tls

    ca = tls.make_ca(tmp_path / "ca")
    server = tls.issue(ca, tmp_path / "ca", "redis")
    port = free_port()
    password = PASSWORD
    acl = tmp_path / "users.acl"
    acl.write_text(ACL.format(password=password) + "\nuser default off\n")
    argv = [
        redis_server_path(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--tls-cert-file", str(server.cert), "--tls-key-file", str(server.key),
        "--tls-ca-cert-file", str(ca.cert), "--tls-auth-clients", "no", "--aclfile", str(acl),
    ]  # fmt: skip
    proc = Proc(f"redis-tls-{port}", argv, log_dir)
    try:
        with redis.Redis(
            port=port, ssl=True, ssl_ca_certs=str(ca.cert), username="prefixpin", password=password, socket_timeout=1
        ) as check:
            wait_until(lambda: _pings(check), timeout=20, interval=0.1, message="redis over TLS")
        url = f"rediss://prefixpin:{password}@127.0.0.1:{port}/0?ssl_ca_certs={ca.cert}"
        base = serve(recorder.base, config=write_config(_store(url)))
        talk = Talk([base])
        c = Conversation(0)
        assert [talk.turn(c), talk.turn(c), talk.fork(c), talk.turn(c)] == [
            "root",
            "continuation",
            "fork",
            "continuation",
        ]
        assert _ready(base).status_code == 200
        assert _fail_open(base) == 0
        assert password not in httpx.get(base + "/metrics", trust_env=False).text
    finally:
        proc.stop()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_forks_recover_after_data_loss(
    serve: Serve, write_config: Config, recorder: Recorder, redis_proc: Callable[..., tuple[Proc, str]]
) -> None:
    """FLUSHALL, then an empty restart, under a running prefixpin: the next turn
    starts again, and a fork after it is repaired with its parent's system and tools."""
    proc, url = redis_proc()
    base = serve(recorder.base, config=write_config(_store(url)))
    talk = Talk([base])
    c = Conversation(0)
    assert [talk.turn(c), talk.fork(c)] == ["root", "fork"]
    with redis.Redis.from_url(url) as client:
        client.flushall()
    assert talk.turn(c) == "root"  # the conversation starts again
    assert talk.fork(c) == "fork"  # its blobs were written again: no process remembers them as held
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    proc.stop()
    redis_proc(port)  # back on the same port, empty
    wait_until(lambda: talk.turn(c) != "fail-open", timeout=20, interval=0.3, message="Redis back")
    assert talk.roles[-1] == "root"
    assert [talk.turn(c), talk.fork(c)] == ["continuation", "fork"]


def test_redis_down_at_start(serve: Serve, write_config: Config, recorder: Recorder, log_dir: Path) -> None:
    """serve starts, says so in a WARNING, /readyz names it, and requests go through."""
    with closed_port() as port:
        base = serve(recorder.base, config=write_config(_store(f"redis://127.0.0.1:{port}/0")))
        r = _ready(base)
        assert r.status_code == 503 and f"127.0.0.1:{port}" in r.text
        talk = Talk([base])
        assert talk.turn(Conversation(0)) == "fail-open"
    logs = "".join(p.read_text(errors="replace") for p in log_dir.glob("prefixpin-*.log"))
    assert "WARNING" in logs and "store failed" in logs


def test_what_a_request_costs_redis(
    serve: Serve, write_config: Config, recorder: Recorder, redis_proc: Callable[..., tuple[Proc, str]]
) -> None:
    """Counted by Redis itself (INFO commandstats, every command a script runs
    included; INFO stats total_reads_processed, the requests it read): at most 12
    commands per proxied request, and 2 round trips on its path (its lookup and its
    record; a fork's blob read adds one), the reports to the tenant's index and a
    script's first load (EVALSHA refused, then EVAL) going after."""
    _, url = redis_proc()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    base = serve(recorder.base, config=write_config(_store(url)))
    with redis.Redis(port=port) as r:
        wait_until(lambda: _ready(base).status_code == 200, timeout=10, message="ready")
        r.config_resetstat()
        reads0 = r.info("stats")["total_reads_processed"]  # this INFO's own read counted
        roles = trace(Talk([base]), conversations=6, turns=5)
        polls = 0

        def settled() -> bool:  # the last reports went out after their responses
            nonlocal polls
            polls += 1
            calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
            return calls.get("cmdstat_evalsha", 0) >= 2 * len(roles)

        wait_until(settled, timeout=10, message="every request's scripts ran")
        stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
        reads = r.info("stats")["total_reads_processed"] - reads0 - polls - 2  # less this test's own INFOs
    stats.pop("config|resetstat", None)
    stats.pop("info", None)
    n, forks = len(roles), roles.count("fork")
    assert roles.count("fail-open") == 0 and forks == 6
    commands = sum(stats.values())
    assert commands / n <= 12, stats
    reports = stats.get("zadd", 0)  # one ZADD per report to the tenant's index
    loads = stats.get("eval", 0)  # a script a server has not seen yet: EVALSHA refused (not counted), then EVAL
    assert stats["evalsha"] == 2 * n + reports, stats  # a lookup and a record per request
    on_path = reads - reports - 2 * loads  # a read may carry two commands: at most this many
    assert 2 * n - loads <= on_path <= 2 * n, (reads, reports, loads, stats)  # a fork's blobs came with its lookup
    assert reports <= n / 2, stats


class _Costs:
    """One request at a time through the request flow (proxy.offline: the addons serve
    runs) on a redis-server, counted by Redis: its commands (INFO commandstats, a
    script's own included) and the requests it read (INFO stats
    total_reads_processed), the reports to the tenants' indexes set aside."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        import asyncio

        from proxy.store.redis import RedisStore

        self.url, self.loop, self.reports = url, asyncio.new_event_loop(), []
        monkeypatch.setattr(RedisStore, "_spawn", lambda _, coro: self.reports.append(coro))
        self.redis = redis.Redis.from_url(url)

    def flow(self, learn: str = "suggest") -> Any:
        import secrets

        from canonicalize import RESPONSES
        from proxy.config import from_mapping
        from proxy.offline import Offline
        from proxy.store.redis import RedisStore
        from tests.proxy import test_responses as rs

        config = from_mapping({"canonicalize": {"learn": learn}, "tenancy": {"anonymous": "shared"}})
        store = RedisStore(self.url, ttl_s=3600, timeout_s=5)
        flow = Offline(config, store=store, new_id=lambda: secrets.token_hex(8))
        # A new connection's setup is not a request's: two connections (a record and a
        # response id's key written side by side) opened first.
        warm = {"role": "assistant", "id": f"resp_{secrets.token_hex(4)}", "output": [rs.MSG]}
        body = rs.req(f"warm up {secrets.token_hex(4)}", key="")
        self.send(flow, body, exchange=RESPONSES, headers={"authorization": "Bearer sk-warm"}, reply=warm)
        return flow

    def send(self, flow: Any, body: dict[str, Any], **kw: Any) -> tuple[str, int, int]:
        """(role, commands, reads) of one request; reads -1: a connection was opened
        meanwhile (its setup's reads are not the request's)."""
        before = {k: v["calls"] for k, v in self.redis.info("commandstats").items()}
        stats = self.redis.info("stats")
        sent = self.loop.run_until_complete(flow.send(body, **kw))
        after = {k: v["calls"] for k, v in self.redis.info("commandstats").items()}
        now = self.redis.info("stats")
        read = now["total_reads_processed"] - stats["total_reads_processed"] - 2  # less these INFOs
        if now["total_connections_received"] != stats["total_connections_received"]:
            read = -1
        setup = ("cmdstat_info", "cmdstat_hello", "cmdstat_client")
        ours = {k: after[k] - before.get(k, 0) for k in after if not k.startswith(setup)}
        while self.reports:
            self.loop.run_until_complete(self.reports.pop())
        return sent.role, sum(ours.values()), read


def test_what_each_path_costs_redis(
    redis_proc: Callable[..., tuple[Proc, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commands and requests Redis reads, per request of each path (docs/deploy.md):
    a conversation's turns and its fork's (a lookup and a record), a Responses API turn
    naming its previous response (the response's key read first; its next key written
    beside the record), learning's (evidence from the tenant's slot), a new root with
    ``learn: pin`` (its marks beside its record) and a resumed conversation (recall)."""
    from canonicalize import RESPONSES, match
    from tests import hermes
    from tests.canonicalize import test_recall as rc
    from tests.infra import unknown_agents as ua
    from tests.proxy import test_responses as rs

    _, url = redis_proc()
    costs = _Costs(url, monkeypatch)
    key = {"authorization": "Bearer sk-costs"}
    flow = costs.flow()
    system = {"role": "system", "content": hermes.system_prompt()}
    history: list[dict[str, Any]] = []
    for step in range(3):
        history.append({"role": "user", "content": f"step {step}"})
        body = {"model": "m", "messages": [system, *history], "tools": hermes.tools_full()}
        role, commands, reads = costs.send(flow, body, headers=key, reply={"role": "assistant", "content": f"{step}"})
        history.append({"role": "assistant", "content": f"{step}"})
        assert (role, reads) == ("root" if step == 0 else "continuation", 2) and commands <= 12
    review = {"role": "system", "content": hermes.system_prompt(skills=hermes.SKILLS_REVIEW)}
    fork = [review, *history, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    for _ in range(2):  # the fork, then its next turn: both forward the parent's system and tools[]
        body = {"model": "m", "messages": fork, "tools": hermes.tools_review()}
        role, commands, reads = costs.send(flow, body, headers=key, reply={"role": "assistant", "content": "Ok."})
        fork += [{"role": "assistant", "content": "Ok."}, {"role": "user", "content": "More."}]
        assert (role, reads) == ("fork", 2) and commands <= 12
    one = {"role": "assistant", "id": "resp_1", "output": [rs.MSG, rs.CALL]}
    assert costs.send(flow, rs.req([rs.DEV, rs.TASK], key=""), exchange=RESPONSES, headers=key, reply=one)[2] == 3
    nxt = rs.req([rs.OUT], key="", previous_response_id="resp_1")
    two = {"role": "assistant", "id": "resp_2", "output": [rs.MSG]}
    role, commands, reads = costs.send(flow, nxt, exchange=RESPONSES, headers=key, reply=two)
    assert (role, reads) == ("continuation", 4) and commands <= 12  # GET, lookup, record and SET side by side
    # Learning: agents no pack knows, with learn: pin.
    learning = costs.flow("pin")
    lines = ua.generate(ua.Spec(sessions=2, turns=4, seed=5))
    seen = []
    for line in lines:
        exchange = match(line["path"])
        seen.append(
            costs.send(learning, line["body"], exchange=exchange, headers=line["headers"], reply=ua.replayed(line))
        )
    roots = [c for c in seen if c[0] == "root" and c[2] >= 0]
    learned = [c for c in seen if c[0] == "continuation" and c[2] >= 0]
    # A root writes its marks beside its record (and a Responses API one its response's key).
    assert roots and all(reads <= 4 and commands <= 12 for _, commands, reads in roots), roots
    # Learning reads the tenant's evidence (beside the lineage's blobs), and may write it
    # beside the record: 3 round trips in a row.
    assert learned and all(reads <= 5 and commands <= 14 for _, commands, reads in learned), learned
    # A resumed conversation (recall: its stem's markers, the lineage's record and first
    # message, the template lines' markers and the check lookup), and its next turn.
    rc_flow = costs.flow("pin")
    costs.send(rc_flow, rc.chat(rc.env("Friday", "What does app.py do?")), headers=key, reply=rc.reply("It greets."))
    costs.send(rc_flow, rc.chat(rc.env("Friday", "Fix the tests.")), headers=key, reply=rc.reply("Fixed."))
    resumed = [rc.env("Saturday", "What does app.py do?"), rc.reply("It greets."), rc.user("Thanks.")]
    role, commands, reads = costs.send(rc_flow, rc.chat(*resumed), headers=key, reply=rc.reply("Sure."))
    assert role == "continuation" and 0 <= reads <= 8 and commands <= 18, (commands, reads)
    role, commands, reads = costs.send(rc_flow, rc.chat(*resumed, rc.reply("Sure."), rc.user("Bye.")), headers=key)
    assert role == "continuation" and 0 <= reads <= 4 and commands <= 12, (commands, reads)
    for f in (flow, learning, rc_flow):
        costs.loop.run_until_complete(f.s.store.close())
    costs.loop.close()
    costs.redis.close()


def test_readyz_names_a_read_only_replica(
    serve: Serve, write_config: Config, recorder: Recorder, redis_proc: Callable[..., tuple[Proc, str]]
) -> None:
    """Pointed at a replica (or a demoted master), prefixpin is not ready, and says why."""
    _, master = redis_proc()
    _, replica = redis_proc()
    master_port = master.rsplit(":", 1)[1].split("/")[0]
    with redis.Redis.from_url(replica) as r:
        r.replicaof("127.0.0.1", master_port)
    base = serve(recorder.base, config=write_config(_store(replica)))
    r503 = _ready(base)
    assert r503.status_code == 503 and "read-only replica" in r503.text, r503.text
    talk, c = Talk([base]), Conversation(0)
    # Forwarded all the same; nothing could be recorded (and the store is skipped a moment after).
    assert {talk.turn(c), talk.turn(c)} <= {"root", "fail-open"}
    with redis.Redis.from_url(replica) as r:
        r.replicaof("NO", "ONE")  # promoted by hand: prefixpin uses it without a restart
    wait_until(lambda: _ready(base).status_code == 200, timeout=10, interval=0.2, message="ready on the new master")
    wait_until(lambda: talk.turn(c) != "fail-open", timeout=15, interval=0.2, message="looked up again")
    assert talk.turn(c) == "continuation"


def test_forks_recover_after_eviction_under_maxmemory(
    serve: Serve, write_config: Config, recorder: Recorder, redis_proc: Callable[..., tuple[Proc, str]]
) -> None:
    """Under ``maxmemory`` with ``allkeys-lru`` (docs/deploy.md) Redis evicts a
    conversation whole; its next turn starts again, and its next fork is repaired."""
    _, url = redis_proc()
    base = serve(recorder.base, config=write_config(_store(url)))
    talk = Talk([base])
    c = Conversation(0)
    assert [talk.turn(c), talk.fork(c)] == ["root", "fork"]
    with redis.Redis.from_url(url) as r:
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory-policy", "allkeys-lru")
        r.config_set("maxmemory", used + 2_000_000)

        # Newer keys than the conversation's, until Redis has evicted it: its LRU is
        # approximate (it samples keys), so how many it takes varies from run to run.
        def homes() -> list[bytes]:
            return [k for k in r.keys("pp:*") if k.endswith(b":h")]

        for i in range(5_000):
            r.set(f"other:{i}", b"x" * 10_000)
            if i >= 200 and i % 50 == 0 and not homes():
                break
        assert int(r.info("stats")["evicted_keys"]) > 0
        assert not homes()
        r.config_set("maxmemory", 0)
    assert talk.turn(c) == "root"
    assert [talk.fork(c), talk.turn(c)] == ["fork", "continuation"]


def test_a_cluster_over_tls_as_an_acl_user(
    serve: Serve, write_config: Config, recorder: Recorder, log_dir: Path, tmp_path: Path
) -> None:
    """rediss:// on a cluster whose nodes speak only TLS (to each other too), as the
    least-privilege user; /readyz checks every master over TLS."""
    from tests.infra import tls
    from tests.infra.redis_topologies import Tls

    ca = tls.make_ca(tmp_path / "ca")
    server = tls.issue(ca, tmp_path / "ca", "redis")
    node = tls.issue(ca, tmp_path / "ca", "redis node", client=True)
    cluster = start_cluster(log_dir, tls=Tls(server.cert, server.key, ca.cert, node.cert, node.key))
    try:
        acl_user(cluster.ports)
        url = f"rediss://prefixpin:{PASSWORD}@127.0.0.1:{cluster.ports[0]}?ssl_ca_certs={ca.cert}"
        base = serve(recorder.base, config=write_config(_store(url, redis_mode="cluster", redis_nodes=cluster.nodes)))
        talk = Talk([base])
        convs = [Conversation(n) for n in range(4)]
        for c in convs:
            assert [talk.turn(c), talk.fork(c), talk.turn(c)] == ["root", "fork", "continuation"]
        assert _ready(base).status_code == 200
        assert _fail_open(base) == 0
    finally:
        cluster.stop()


# What prefixpin asks a Sentinel that requires a password (docs/deploy.md): the masters it watches.
SENTINEL_ACL = "user prefixpin on >{password} -@all +sentinel|masters"


def test_a_sentinel_group_over_tls_as_an_acl_user(
    serve: Serve, write_config: Config, recorder: Recorder, log_dir: Path, tmp_path: Path
) -> None:
    """rediss:// on a Sentinel group whose master, replicas and Sentinels speak only
    TLS (replication and the Sentinels' own links too), as the least-privilege user on
    the data nodes and the same user, allowed only SENTINEL MASTERS, on Sentinels that
    require a password; a failover is followed over TLS."""
    from tests.infra import tls
    from tests.infra.redis_topologies import Tls

    ca = tls.make_ca(tmp_path / "ca")
    server = tls.issue(ca, tmp_path / "ca", "redis")
    node = tls.issue(ca, tmp_path / "ca", "redis node", client=True)
    group = start_sentinel_group(
        log_dir,
        tls=Tls(server.cert, server.key, ca.cert, node.cert, node.key),
        users=(SENTINEL_ACL.format(password=PASSWORD),),
    )
    try:
        acl_user([group.master, *group.replicas])
        url = group.url.replace("rediss://", f"rediss://prefixpin:{PASSWORD}@", 1)
        config = _store(url, redis_mode="sentinel", redis_nodes=group.nodes, sentinel_master=group.name)
        base = serve(recorder.base, config=write_config(config))
        talk = Talk([base])
        c = Conversation(0)
        assert [talk.turn(c), talk.turn(c)] == ["root", "continuation"]
        old = group.current_master()
        new = group.failover()
        assert new != old
        # The demoted master answers READONLY (a turn meanwhile is forwarded as sent);
        # prefixpin asks the Sentinels again, over TLS, and finds the conversation there.
        before = len(talk.roles)
        wait_until(lambda: talk.turn(c) != "fail-open", timeout=30, interval=0.3, message="a turn on the new master")
        assert set(talk.roles[before:]) <= {"fail-open", "continuation"} and talk.roles[-1] == "continuation"
        assert [talk.turn(c), talk.fork(c), talk.turn(c)] == ["continuation", "fork", "continuation"]
        assert _ready(base).status_code == 200
        assert info(new, "replication")["role"] == "master"
        assert PASSWORD not in httpx.get(base + "/metrics", trust_env=False).text
    finally:
        group.stop()
