"""Opening Redis as the config says: one server, a Redis Cluster, or a master
watched by Sentinels (``store.redis_mode``, SPEC section 2g).

Every mode reads ``store.redis_url`` the same way: its user and password (an ACL
user, or the ``default`` user's password), ``rediss://`` for TLS (the CA from the
system's store, ``SSL_CERT_FILE``, or ``?ssl_ca_certs=PATH``; a client
certificate with ``?ssl_certfile=&ssl_keyfile=``), and its database (standalone
and sentinel).  ``store.redis_nodes`` adds the cluster's other nodes or the other
Sentinels.  The clients are redis-py's own: ``RedisCluster`` follows MOVED / ASK
and refreshes its map of the slots after a node fails (a replica promoted in its
place); a Sentinel-managed pool asks the Sentinels for the master again after a
connection fails or the old master answers READONLY.

Retries are few and immediate: a store that is down must cost a request one
timeout (``store.timeout_ms``), never a backoff (proxy.store.guard).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

Client: TypeAlias = "Redis | RedisCluster"


def host_port(node: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) as a pair."""
    host, _, port = node.rpartition(":")
    return host.strip("[]"), int(port)


def _kwargs(url: str, timeout_s: float) -> dict[str, Any]:
    """What every connection of every mode gets: the URL's credentials, TLS and
    database, the timeouts, and one immediate retry."""
    kw: dict[str, Any] = dict(parse_url(url))
    if kw.pop("connection_class", None) is SSLConnection:
        kw["ssl"] = True
    kw.update(
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=0,
        decode_responses=False,
    )
    return kw


def open_client(url: str, mode: str, nodes: tuple[str, ...], master: str | None, timeout_s: float) -> Client:
    """The client for ``store.redis_mode``; nothing is connected until the first command."""
    kw = _kwargs(url, timeout_s)
    if mode == "cluster":
        kw.pop("db", None)
        first = ClusterNode(kw.pop("host", "127.0.0.1"), kw.pop("port", 6379))
        more = [ClusterNode(*host_port(n)) for n in nodes]
        # require_full_coverage=False: while one shard has no master, the others serve.
        return RedisCluster(startup_nodes=[first, *more], require_full_coverage=False, **kw)
    if mode == "sentinel":
        sentinels = [(kw.pop("host", "127.0.0.1"), kw.pop("port", 26379)), *(host_port(n) for n in nodes)]
        auth: dict[str, Any] = {k: kw[k] for k in ("username", "password") if k in kw}
        tls = {k: v for k, v in kw.items() if k.startswith("ssl")}
        timeouts = {k: kw[k] for k in ("socket_timeout", "socket_connect_timeout")}
        manager = _Sentinels(sentinels, sentinel_kwargs={**timeouts, **tls, **auth}, open_kwargs={**timeouts, **tls})
        assert master is not None  # proxy.config: required with redis_mode: sentinel
        client: Redis = manager.master_for(master, **kw)
        return client
    return Redis(**kw)


class _Sentinels(Sentinel):
    """redis-py's Sentinel, sending the URL's credentials to the Sentinels only when
    they require them: a Sentinel without a password refuses AUTH, so after such an
    answer the Sentinels are asked again without."""

    def __init__(
        self, sentinels: list[tuple[str, int]], *, sentinel_kwargs: dict[str, Any], open_kwargs: dict[str, Any]
    ) -> None:
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        self.open_kwargs: dict[str, Any] | None = open_kwargs
        self.hosts = sentinels

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError as exc:  # each Sentinel's error is in its text
            if self.open_kwargs is None or "AuthenticationError" not in str(exc):
                raise
            for old in self.sentinels:
                await old.aclose()
            self.sentinels = [Redis(host=h, port=p, **self.open_kwargs) for h, p in self.hosts]
            self.open_kwargs = None  # once: from now on the Sentinels are asked without
            return await super().discover_master(service_name)


__all__ = ["Client", "host_port", "open_client"]
