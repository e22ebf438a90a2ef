"""What the Redis store costs Redis per proxied request: commands, round trips and
Redis CPU, on one redis-server and on a Redis Cluster, with several prefixpin
processes.

    python -m benchmarks.bench_store [--conversations 48] [--turns 8] [--threads 6]
                                     [--setups standalone:1,standalone:3,cluster:3] [--replay]
                                     [--smoke] [--json]

Each setup starts its Redis (a redis-server; or a cluster of 3 masters and 3
replicas), N ``prefixpin serve`` processes in front of a recording upstream
(tests.infra.recorder: it answers at once), and sends hermes conversations
(tests.infra.agent_trace: each turn a continuation, a review fork of each after its
second turn), each request to the next process, from several threads at once.
Redis' own counters, summed over its masters, are read before and after:

    commands       every command Redis ran (INFO commandstats), those the scripts
                   ran included (not a new connection's CLIENT SETINFO)
    round trips    requests Redis read from prefixpin (INFO stats total_reads_processed):
                   the request's lookup (a fork's blobs come with it) and record, the
                   reports to the tenants' indexes that go out after the response,
                   and each new connection's setup (a short run counts many of those)
    script us      Redis' time in the commands prefixpin sends (INFO commandstats
                   usec of EVALSHA / EVAL, which includes the commands a script runs,
                   and of GET / SET / DEL / HGET); a blob read outside a script
                   (HMGET, ~1 us) is left out, as it cannot be told from the
                   scripts' own HMGETs
    cpu us         Redis' main thread CPU time (INFO cpu), its idle housekeeping included

Divided by the requests proxied.  The machine's load changes the times (not the
counts): say it with the figures.

``--replay`` measures Redis busy, as a shard serving thousands of requests a second
is: the same conversations go once through prefixpin's own request path in process
(proxy.offline, its store calls captured), then those store calls are replayed
against a fresh redis-server by 64 concurrent conversations, as fast as it takes
them; the table gives the same counters per request, and the requests per second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import yaml

from tests.infra.agent_trace import Conversation, Talk
from tests.infra.procs import Proc, free_port, start_prefixpin, start_redis
from tests.infra.redis_topologies import start_cluster

TOP_LEVEL = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_get", "cmdstat_set", "cmdstat_del", "cmdstat_hget")


def _masters(setup: str, log_dir: Path) -> tuple[list[int], dict[str, Any], Any]:
    """The Redis of ``setup``: its masters' ports, the store config, something to stop."""
    if setup == "cluster":
        cluster = start_cluster(log_dir)
        store = {"redis_url": cluster.url, "redis_mode": "cluster", "redis_nodes": cluster.nodes}
        return cluster.master_ports(), store, cluster
    proc, url = start_redis(log_dir, name=f"redis-bench-{free_port()}")
    return [int(url.rsplit(":", 1)[1].split("/")[0])], {"redis_url": url}, proc


def _counters(ports: list[int]) -> dict[str, float]:
    out: Counter[str] = Counter(commands=0, usec=0, reads=0, cpu=0)
    for port in ports:
        with redis.Redis(port=port) as r:
            for name, stat in r.info("commandstats").items():
                if name.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_client")):
                    continue  # this benchmark's own, and a new connection's CLIENT SETINFO
                out["commands"] += stat["calls"]
                if name in TOP_LEVEL:
                    out["usec"] += stat["usec"]
            out["reads"] += r.info("stats")["total_reads_processed"]
            cpu = r.info("cpu")
            out["cpu"] += cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]
    return dict(out)


def _drive(bases: list[str], conversations: int, turns: int, threads: int) -> list[str]:
    """``conversations`` split over ``threads`` threads, each its own Talk."""

    def one(k: int) -> list[str]:
        talk = Talk(bases[k % len(bases) :] + bases[: k % len(bases)], key=f"sk-bench-{k % 3}")
        convs = [Conversation(n) for n in range(k, conversations, threads)]
        for t in range(turns):
            for c in convs:
                talk.turn(c)
                if t == 1:
                    talk.fork(c)
        return talk.roles

    with ThreadPoolExecutor(threads) as pool:
        return [role for roles in pool.map(one, range(threads)) for role in roles]


def run(setup: str, processes: int, conversations: int, turns: int, threads: int) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="bench-store-"))
    procs: list[Proc] = []
    ports, store, topology = _masters(setup, log_dir)
    try:
        up = free_port()
        recorder = Proc("recorder", [sys.executable, "-m", "tests.infra.recorder", "--port", str(up)], log_dir)
        procs.append(recorder)
        recorder.wait_http(f"http://127.0.0.1:{up}/health")
        config = log_dir / "config.yaml"
        config.write_text(yaml.safe_dump({"store": {"backend": "redis", **store}, "log": {"level": "warning"}}))
        bases = []
        for i in range(processes):
            proc, base = start_prefixpin(log_dir, upstream=f"http://127.0.0.1:{up}", config=config, name=f"pp-{i}")
            procs.append(proc)
            bases.append(base)
        for port in ports:
            with redis.Redis(port=port) as r:
                r.config_resetstat()
        before = _counters(ports)
        started = time.monotonic()
        roles = _drive(bases, conversations, turns, threads)
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the last reports to the tenants' indexes land
        after = _counters(ports)
        n = len(roles)
        return {
            "setup": setup,
            "processes": processes,
            "requests": n,
            "roles": dict(Counter(roles)),
            "req_per_s": round(n / elapsed, 1),
            "commands": round((after["commands"] - before["commands"]) / n, 2),
            "round_trips": round((after["reads"] - before["reads"] - len(ports) * 3) / n, 2),
            "script_us": round((after["usec"] - before["usec"]) / n, 1),
            "cpu_us": round((after["cpu"] - before["cpu"]) * 1e6 / n, 1),
        }
    finally:
        for proc in procs:
            proc.stop()
        topology.stop()


class _Capture:
    """A MemoryStore that notes each call a request makes (lookup, blobs, record)."""

    def __init__(self) -> None:
        from proxy.store.memory import MemoryStore

        self.inner = MemoryStore()
        self.records_at = "after_last_byte"
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def noted(*args: Any, **kw: Any) -> Any:
            if name in ("lookup", "blobs", "record", "response", "record_response", "tenant_wide"):
                self.calls.append((name, args, kw))
            return await method(*args, **kw)

        return noted


def _capture(conversations: int, turns: int) -> list[list[tuple[str, tuple[Any, ...], dict[str, Any]]]]:
    """Each request's store calls, conversation by conversation, as the proxy makes them."""
    import asyncio
    import secrets

    from proxy.config import load
    from proxy.offline import Offline
    from tests import hermes
    from tests.infra.agent_trace import SESSIONS

    store = _Capture()
    off = Offline(load(None, env={}), store=store, new_id=lambda: secrets.token_hex(8))
    reply = {"role": "assistant", "content": "Done."}
    per_request: list[list[tuple[str, tuple[Any, ...], dict[str, Any]]]] = []
    key = {"authorization": "Bearer sk-bench"}

    async def send(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        mark = len(store.calls)
        await off.send({"model": "tiny", "messages": messages, "tools": tools}, headers=key, reply=reply)
        per_request.append(store.calls[mark:])

    async def go() -> None:
        convs = [Conversation(n) for n in range(conversations)]
        for t in range(turns):
            for c in convs:
                c.history.append({"role": "user", "content": f"conversation {c.n}, step {t}: go on."})
                await send([c.system(t), *c.history], hermes.tools_full())
                c.history.append(reply)
                if t == 1:
                    system = hermes.system_prompt(session=SESSIONS[1], skills=hermes.SKILLS_REVIEW)
                    fork = [{"role": "system", "content": system}, *c.history, {"role": "user", "content": "Review."}]
                    await send(fork, hermes.tools_review())

    asyncio.run(go())
    return per_request


def replay(conversations: int, turns: int) -> dict[str, Any]:
    """The captured store calls against a fresh redis-server, 64 at a time."""
    import asyncio

    from proxy.store.redis import RedisStore

    requests = _capture(conversations, turns)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-store-"))
    proc, url = start_redis(log_dir, name=f"redis-replay-{free_port()}")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with redis.Redis(port=port) as r:
            r.config_resetstat()
        before = _counters([port])

        async def go() -> float:
            store = RedisStore(url, timeout_s=5)
            queue = list(requests)
            lanes: list[list[Any]] = [queue[i::64] for i in range(64)]

            async def lane(items: list[Any]) -> None:
                for calls in items:
                    for name, args, kw in calls:
                        await getattr(store, name)(*args, **kw)

            started = time.monotonic()
            await asyncio.gather(*(lane(items) for items in lanes))
            elapsed = time.monotonic() - started
            await store.close()
            return elapsed

        elapsed = asyncio.run(go())
        after = _counters([port])
        n = len(requests)
        return {
            "setup": "replay",
            "processes": 0,
            "requests": n,
            "roles": {},
            "req_per_s": round(n / elapsed, 1),
            "commands": round((after["commands"] - before["commands"]) / n, 2),
            "round_trips": round((after["reads"] - before["reads"] - 3) / n, 2),
            "script_us": round((after["usec"] - before["usec"]) / n, 1),
            "cpu_us": round((after["cpu"] - before["cpu"]) * 1e6 / n, 1),
        }
    finally:
        proc.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=48)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--setups", default="standalone:1,standalone:3,cluster:3")
    ap.add_argument("--replay", action="store_true", help="also replay the store calls at full speed")
    ap.add_argument("--smoke", action="store_true", help="a small run of every setup, for CI")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.conversations, args.turns, args.threads, args.replay = 4, 3, 2, True
    rows = [replay(args.conversations * 4, args.turns)] if args.replay else []
    for item in filter(None, args.setups.split(",")):
        setup, _, n = item.partition(":")
        rows.append(run(setup, int(n or 1), args.conversations, args.turns, args.threads))
    if args.json:
        print(json.dumps({"loadavg": os.getloadavg(), "rows": rows}, indent=2))
        return
    print(f"loadavg {os.getloadavg()[0]:.1f}")
    head = ("setup", "procs", "requests", "req/s", "commands", "round trips", "script us", "cpu us")
    keys = ("processes", "requests", "req_per_s", "commands", "round_trips", "script_us", "cpu_us")
    print(f"{head[0]:<12}" + "".join(f"{h:>{len(h) + 3}}" for h in head[1:]))
    for r in rows:
        print(f"{r['setup']:<12}" + "".join(f"{r[k]!s:>{len(h) + 3}}" for k, h in zip(keys, head[1:], strict=True)))


if __name__ == "__main__":
    main()
