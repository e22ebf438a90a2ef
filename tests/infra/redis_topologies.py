"""The Redis that teams run, started for a test on free loopback ports: a Redis
Cluster (masters and their replicas, made by ``redis-cli --cluster create``), a
Sentinel group (a master, its replicas, three Sentinels), and servers with an ACL
user and TLS.  Every process is a :class:`tests.infra.procs.Proc`; ``stop()``
stops them all."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

from tests.infra.procs import Proc, free_ports, redis_server_path
from tests.infra.wait import wait_until

CLI = "redis-cli"


def _server(log_dir: Path, name: str, port: int, *extra: str, tls: Tls | None = None) -> Proc:
    listen = ["--port", str(port)]
    if tls is not None:  # TLS only, between the nodes too
        _TLS[port] = {"ssl": True, "ssl_ca_certs": str(tls.ca)}
        listen = [
            "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
            "--tls-ca-cert-file", str(tls.ca), "--tls-auth-clients", "no", "--tls-cluster", "yes",
            "--tls-replication", "yes", "--tls-client-cert-file", str(tls.client_cert),
            "--tls-client-key-file", str(tls.client_key),
        ]  # fmt: skip
    argv = [redis_server_path(), *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = Proc(name, [*argv, *extra], log_dir)
    wait_until(lambda: _answers(proc, port), timeout=20, interval=0.05, message=f"{name} answers on {port}")
    return proc


_TLS: dict[int, dict[str, Any]] = {}  # the servers that speak only TLS or require a user: how to connect to them


def ask(port: int, *command: object, timeout: float = 2) -> Any:
    """One command to the server on ``port``, on a connection closed after it."""
    with redis.Redis(port=port, socket_timeout=timeout, **_TLS.get(port, {})) as client:
        return client.execute_command(*command)


def info(port: int, section: str) -> dict[str, Any]:
    with redis.Redis(port=port, socket_timeout=2, **_TLS.get(port, {})) as client:
        return dict(client.info(section))


def _answers(proc: Proc, port: int) -> bool:
    """Does *this* server answer on ``port``?  (Another may hold a port that was free a
    moment ago: this one then exits, and its log says why.)"""
    if not proc.alive():
        raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
    try:
        return int(info(port, "server")["process_id"]) == proc.popen.pid
    except redis.RedisError:
        return False


@dataclass(frozen=True)
class Tls:
    """A server certificate and its key, the CA that signed it, and a client
    certificate it signed (the cluster bus authenticates both ends)."""

    cert: Path
    key: Path
    ca: Path
    client_cert: Path
    client_key: Path


@dataclass
class Cluster:
    """A Redis Cluster: ``ports[:masters]`` started as masters, the rest their replicas."""

    log_dir: Path
    masters: int
    ports: list[int]
    procs: dict[int, Proc] = field(default_factory=dict)
    tls: Tls | None = None
    bus: list[int] = field(default_factory=list)  # the nodes' cluster bus ports, in the order of ``ports``

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.ports[0]}?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.ports[0]}"

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports[1:]]

    def role(self, port: int) -> str:
        return str(info(port, "replication")["role"])

    def master_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.alive() and self.role(p) == "master"]

    def ok(self) -> bool:
        """Every live node says the cluster is ok and its slots are all served."""
        for port, proc in self.procs.items():
            if not proc.alive():
                continue
            try:
                state = ask(port, "CLUSTER INFO")
            except redis.RedisError:
                return False
            if not isinstance(state, dict):  # redis-py parses it, in its own way
                state = dict(line.split(":", 1) for line in state.decode().split() if ":" in line)
            if state.get("cluster_state") != "ok" or int(state.get("cluster_slots_ok", 0)) != 16384:
                return False
        return True

    def kill(self, port: int) -> None:
        """A node dies (SIGKILL: no goodbye to the others)."""
        self.procs[port].popen.kill()
        self.procs[port].popen.wait()

    def flush(self) -> None:
        for port in self.master_ports():
            ask(port, "FLUSHALL")

    def stop(self) -> None:
        for port, proc in self.procs.items():
            proc.stop()
            _TLS.pop(port, None)


def start_cluster(
    log_dir: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000, tls: Tls | None = None
) -> Cluster:
    """``masters`` masters with ``replicas`` replicas each (``tls``: TLS only, between
    the nodes too); waits until the cluster is ok."""
    nodes = masters * (1 + replicas)
    ports = free_ports(2 * nodes)  # each node's port and its cluster bus port, all different
    cluster = Cluster(log_dir, masters, ports[:nodes], tls=tls, bus=ports[nodes:])
    try:
        _create(cluster, replicas, node_timeout_ms)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _create(cluster: Cluster, replicas: int, node_timeout_ms: int) -> None:
    log_dir, ports = cluster.log_dir, cluster.ports
    folder = log_dir / f"cluster-{ports[0]}"
    folder.mkdir(parents=True, exist_ok=True)
    for port, bus in zip(ports, cluster.bus, strict=True):
        cluster.procs[port] = _server(
            log_dir,
            f"redis-cluster-{port}",
            port,
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(folder / f"nodes-{port}.conf"),
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-port", str(bus),  # not port + 10000: free ports go past 55535
            "--dir", str(folder),
            tls=cluster.tls,
        )  # fmt: skip
    nodes = [f"127.0.0.1:{p}" for p in ports]
    secure = ["--tls", "--cacert", str(cluster.tls.ca)] if cluster.tls is not None else []
    subprocess.run(
        [CLI, *secure, "--cluster", "create", *nodes, "--cluster-replicas", str(replicas), "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    wait_until(cluster.ok, timeout=30, interval=0.1, message="the cluster is ok")
    wait_until(lambda: _replicas_synced(cluster), timeout=30, interval=0.1, message="the replicas are in sync")


def _replicas_synced(cluster: Cluster) -> bool:
    for port in cluster.procs:
        state = info(port, "replication")
        if state["role"] == "slave" and state.get("master_link_status") != "up":
            return False
    return True


@dataclass
class SentinelGroup:
    """A master, its replicas and three Sentinels watching it as ``name``."""

    log_dir: Path
    name: str
    master: int
    replicas: list[int]
    sentinels: list[int]
    procs: dict[int, Proc] = field(default_factory=dict)
    tls: Tls | None = None

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.sentinels[0]}?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.sentinels[0]}"

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinels[1:]]

    def current_master(self) -> int:
        addr = ask(self.sentinels[0], "SENTINEL", "get-master-addr-by-name", self.name)
        return int(addr[1])

    def failover(self) -> int:
        """SENTINEL FAILOVER, then wait until a replica is the master everyone names
        and the old master is its replica (until the Sentinels demote it, the old
        master still takes writes)."""
        old = self.current_master()
        wait_until(lambda: _caught_up(old), timeout=30, interval=0.1, message="the replicas hold every write")
        ask(self.sentinels[0], "SENTINEL", "FAILOVER", self.name, timeout=5)

        def moved() -> bool:
            try:
                new = self.current_master()
                return new != old and info(new, "replication")["role"] == "master"
            except redis.RedisError:
                return False

        def demoted() -> bool:
            try:
                state, new = info(old, "replication"), self.current_master()
            except redis.RedisError:
                return False
            return (state["role"], state.get("master_port"), state.get("master_link_status")) == ("slave", new, "up")

        wait_until(moved, timeout=30, interval=0.1, message="the Sentinels promoted a replica")
        wait_until(demoted, timeout=30, interval=0.1, message="the old master is the new one's replica")
        return self.current_master()

    def stop(self) -> None:
        for port, proc in self.procs.items():
            proc.stop()
            _TLS.pop(port, None)


# The user Sentinels that require a password give each other (``sentinel sentinel-user``) and the test's own commands.
SENTINEL_ADMIN = ("sentinel-admin", "admin-pass-for-the-test")


def _caught_up(master: int) -> bool:
    """Every replica of ``master`` is online and has every write it had when asked."""
    state = info(master, "replication")
    goal = int(state["master_repl_offset"])
    replicas = [v for k, v in state.items() if k.startswith("slave") and isinstance(v, dict)]
    return len(replicas) == int(state["connected_slaves"]) > 0 and all(
        r["state"] == "online" and int(r["offset"]) >= goal for r in replicas
    )


def start_sentinel_group(
    log_dir: Path, replicas: int = 2, name: str = "pp-master", tls: Tls | None = None, users: tuple[str, ...] = ()
) -> SentinelGroup:
    """A master, ``replicas`` replicas and three Sentinels (``tls``: every one of them
    TLS only, replication and the Sentinels' own links included).  ``users``: ACL
    lines defined on each Sentinel, whose ``default`` user is then off (the Sentinels
    authenticate to each other as :data:`SENTINEL_ADMIN`)."""
    master, *others = free_ports(1 + replicas + 3)
    group = SentinelGroup(log_dir, name, master, others[:replicas], [], tls=tls)
    try:
        _watch(group, replicas, users, others[replicas:])
    except BaseException:
        group.stop()
        raise
    return group


def _watch(group: SentinelGroup, replicas: int, users: tuple[str, ...], sentinels: list[int]) -> None:
    log_dir, name, master = group.log_dir, group.name, group.master
    folder = log_dir / f"sentinel-{master}"
    folder.mkdir(parents=True, exist_ok=True)
    # Their own folders: a replica's full sync writes an RDB file (not in the work tree).
    for port in (master, *group.replicas):
        (folder / str(port)).mkdir(exist_ok=True)
    # A replica's full sync at once (not after 5 s waiting for more replicas).
    at = ("--dir", str(folder / str(master)), "--repl-diskless-sync-delay", "0")
    group.procs[master] = _server(log_dir, f"redis-master-{master}", master, *at, tls=group.tls)
    for port in group.replicas:
        at = ("--dir", str(folder / str(port)), "--repl-diskless-sync-delay", "0")
        group.procs[port] = _server(
            log_dir, f"redis-replica-{port}", port, *at, "--replicaof", "127.0.0.1", str(master), tls=group.tls
        )
    for port in sentinels:
        conf = folder / f"sentinel-{port}.conf"
        watch = (
            f"bind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {name} 127.0.0.1 {master} 2\n"
            f"sentinel down-after-milliseconds {name} 1000\n"
            f"sentinel failover-timeout {name} 5000\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        conf.write_text(_listen(group.tls, port) + _users(users) + watch)
        if group.tls is not None:
            _TLS[port] = {"ssl": True, "ssl_ca_certs": str(group.tls.ca)}
        if users:
            _TLS[port] = {**_TLS.get(port, {}), "username": SENTINEL_ADMIN[0], "password": SENTINEL_ADMIN[1]}
        proc = Proc(f"redis-sentinel-{port}", [redis_server_path(), str(conf), "--sentinel"], log_dir)
        group.procs[port] = proc
        group.sentinels.append(port)
        wait_until(partial(_answers, proc, port), timeout=20, interval=0.05, message="a Sentinel answers")

    def watched() -> bool:
        for port in group.sentinels:
            try:
                state = ask(port, "SENTINEL", "MASTER", name)
            except redis.RedisError:
                return False
            if not isinstance(state, dict):
                state = dict(zip(state[::2], state[1::2], strict=False))
            state = {(k.decode() if isinstance(k, bytes) else k): v for k, v in state.items()}
            if int(state.get("num-other-sentinels", 0)) < 2 or int(state.get("num-slaves", 0)) < replicas:
                return False
        return True

    wait_until(watched, timeout=30, interval=0.1, message="every Sentinel sees the others and the replicas")
    wait_until(lambda: _caught_up(master), timeout=30, interval=0.1, message="the replicas are in sync")


def _listen(tls: Tls | None, port: int) -> str:
    """A Sentinel's port; with ``tls``, TLS only, to the master, the replicas and the other Sentinels too."""
    if tls is None:
        return f"port {port}\n"
    return (
        f"port 0\ntls-port {port}\ntls-cert-file {tls.cert}\ntls-key-file {tls.key}\n"
        f"tls-ca-cert-file {tls.ca}\ntls-auth-clients no\ntls-replication yes\n"
        f"tls-client-cert-file {tls.client_cert}\ntls-client-key-file {tls.client_key}\n"
    )


def _users(users: tuple[str, ...]) -> str:
    """``users`` on a Sentinel, which then requires a password: its ``default`` user off,
    and the Sentinels authenticating to each other as :data:`SENTINEL_ADMIN`."""
    if not users:
        return ""
    admin, password = SENTINEL_ADMIN
    lines = [*users, f"user {admin} on >{password} allcommands allkeys allchannels", "user default off"]
    lines += [f"sentinel sentinel-user {admin}", f"sentinel sentinel-pass {password}"]
    return "".join(line + "\n" for line in lines)
