"""Several worker processes on one port (``listen.workers``), state shared.

One Python process serves ~1 core; the request path is CPU-bound, so ``prefixpin
serve`` can run several workers (``listen.workers: N``; ``auto``: one per CPU, at
most 8).

- **The serve process** binds nothing it accepts on: it checks the address, starts
  the workers, restarts a worker that dies, and stops them all on SIGTERM / SIGINT.
  With the embedded store (``store.backend: memory``) it keeps a copy of it that
  every worker writes to and a starting worker loads (:mod:`proxy.store.replica`).
- **Each worker** is a fresh interpreter (``python -m proxy.workers FD``; no fork
  of a running event loop) serving its own ``SO_REUSEPORT`` socket on the one
  port, so the kernel spreads connections over the workers.  With the embedded
  store it holds a whole copy and answers its own lookups; its writes reach every
  other copy before its client has the answer, so a next turn finds its lineage on
  any worker.  With Redis the workers use Redis themselves.  It talks to the serve
  process over a socketpair (:class:`proxy.link.Link`): ``/metrics`` (every
  worker's counters, summed), the store's copy when it starts, and its own
  readiness.  A worker whose serve process is gone stops.
- Process-wide limits are split: each worker opens ``upstream.max_connections / N``
  upstream connections and admits ``limits.max_concurrency / N`` requests (rounded
  up; the kernel's spread of connections makes that limit approximate).
  ``auto`` is one worker where one process must see everything: llama-server
  slots (``affinity.llama_slots``) and an exact ``limits.max_concurrency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.samples import Sample

from proxy.config import Config
from proxy.link import Link, LinkClosed, encode
from proxy.redact import redact
from proxy.store.memory import MemoryStore
from proxy.store.replica import HUB, Mesh, ReplicaStore, applier

log = logging.getLogger("prefixpin")

MAX_AUTO = 8
_STARTUP_S = 60.0  # a worker that is not ready by then is a failed start
_STOP_S = 15.0  # uvicorn's own graceful shutdown is 10 s
_SCRAPE_S = 5.0
_DRAIN_S = 0.01  # how often an idle copy reads what the others wrote (a busy one reads before each lookup)


def worker_count(config: Config) -> int:
    """``listen.workers``, with ``auto`` (0) resolved for this machine."""
    if config.listen.workers:
        return config.listen.workers
    if config.affinity.llama_slots or config.limits.max_concurrency:
        return 1  # one process owns the slot table / counts every request in flight exactly
    return max(1, min(cpus(), MAX_AUTO))


def cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its affinity, within a container's CPU quota."""
    n = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def share(config: Config, workers: int) -> Config:
    """A worker's config: the process-wide limits divided among ``workers``."""
    if workers <= 1:
        return config
    limits, upstream = config.limits, config.upstream
    return dataclasses.replace(
        config,
        limits=dataclasses.replace(
            limits,
            max_concurrency=math.ceil(limits.max_concurrency / workers) if limits.max_concurrency else 0,
        ),
        upstream=dataclasses.replace(upstream, max_connections=math.ceil(upstream.max_connections / workers)),
    )


# --- /metrics over all workers ----------------------------------------------------------


def merge(scrapes: Iterable[Sequence[Metric]]) -> list[Metric]:
    """Sum the samples of the same name and labels across scrapes (counters and
    histogram buckets add up; a ``_created`` time is the earliest)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for scrape in scrapes:
        for family in scrape:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            acc = values[family.name]
            for s in family.samples:
                key = (s.name, tuple(s.labels.items()))
                if key not in acc:
                    acc[key] = s.value
                elif s.name.endswith("_created"):
                    acc[key] = min(acc[key], s.value)
                else:
                    acc[key] += s.value
    for name, merged in families.items():
        merged.samples = [Sample(n, dict(labels), v) for (n, labels), v in values[name].items()]
    return list(families.values())


class _Scrape:
    """What ``generate_latest`` needs: a ``collect()``."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(scrapes: Iterable[Sequence[Metric]]) -> bytes:
    return generate_latest(_Scrape(merge(scrapes)))


# --- the worker side --------------------------------------------------------------------


class Fleet:
    """A worker's link to its serve process (``create_app(fleet=...)``)."""

    def __init__(self, sock: socket.socket, index: int, replica: ReplicaStore | None = None) -> None:
        self.sock = sock
        self.index = index
        self.replica = replica  # this worker's copy of the embedded store (its mesh listening already)
        self.link: Link | None = None
        self.registry: CollectorRegistry | None = None
        self.on_lost: Any = None  # set by the worker: stop serving
        self.before_collect: Any = None  # set by the app: the counting that waits (proxy.addons.Runner.drain)
        self._drainer: asyncio.TimerHandle | None = None

    async def start(self, registry: CollectorRegistry) -> Link:
        """Connect (in the worker's event loop), load the store's copy, say ready."""
        self.registry = registry
        self.link = link = await Link.open(self.sock, self._handle, name=f"worker {self.index}'s link")
        link.lost.add_done_callback(self._lost)
        if self.replica is not None and self.replica.mesh is not None:
            # Listening since before this call: what a peer writes from now on is in
            # our buffers; what it wrote before, the serve process's copy has.
            self.replica.local.load(await link.call("store.snapshot", timeout=_STARTUP_S))
            self.replica.mesh.drain()
            self._drain()
        await link.call("ready", os.getpid(), timeout=_STARTUP_S)
        return link

    def _drain(self) -> None:
        assert self.replica is not None and self.replica.mesh is not None
        try:
            self.replica.mesh.drain()
        except Exception:
            log.exception("worker %d: reading the other workers' writes failed", self.index)
        self._drainer = asyncio.get_running_loop().call_later(_DRAIN_S, self._drain)

    def _lost(self, _: object) -> None:
        if self.on_lost is not None:
            log.error("worker %d: the serve process is gone; stopping", self.index)
            self.on_lost()

    def _handle(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "collect":
            if self.before_collect is not None:
                self.before_collect()
            return list(self.registry.collect()) if self.registry is not None else []
        raise ValueError(f"unknown operation {name!r}")

    async def exposition(self) -> bytes:
        """Every worker's metrics, summed (asked of the serve process)."""
        if self.link is None:
            raise LinkClosed("not connected")
        data: bytes = await self.link.call("metrics", timeout=_SCRAPE_S * 2)
        return data

    async def close(self) -> None:
        self.on_lost = None  # stopping anyway
        if self._drainer is not None:
            self._drainer.cancel()
        if self.link is not None:
            self.link.close()


def _bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def claim(host: str, port: int) -> socket.socket:
    """The serve process's hold on the port, which it never accepts on.

    Bound first without ``SO_REUSEPORT``: that fails while anything else holds the
    port (another prefixpin too), where the workers' sockets alone would quietly
    share it.  Then held with it, so the workers can join."""
    with _bind(host, port, reuse_port=False) as plain:
        port = plain.getsockname()[1]  # port 0 becomes one
    return _bind(host, port, reuse_port=True)


def _listen_socket(host: str, port: int) -> socket.socket:
    """A worker's own listening socket on the shared port."""
    sock = _bind(host, port, reuse_port=True)
    sock.listen(2048)
    return sock


def _recv_hello(sock: socket.socket) -> tuple[Config, int, int, str, int, str]:
    """The first frame, read before any event loop runs."""
    f = sock.makefile("rb")
    size = int.from_bytes(f.read(4), "big")
    _, _, _, value = pickle.loads(f.read(size))
    f.close()
    config, index, workers, host, port, fleet = value
    return config, index, workers, host, port, fleet


def nodes(workers: int) -> list[str]:
    """The store's copies, in the order a write reaches them: the serve process's
    first (a worker that starts loads it), then every worker's."""
    return [HUB, *(str(i) for i in range(workers))]


def worker_main(fd: int) -> int:
    """A worker process: serve the shared port with the app until told to stop."""
    from proxy.cli import run_uvicorn
    from proxy.store import open_store

    sock = socket.socket(fileno=fd)
    try:
        config, index, workers, host, port, fleet_id = _recv_hello(sock)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError):
        return 3  # the serve process went away before saying what to serve
    config = share(config, workers)
    replica = None
    if config.store.backend == "memory":
        local = open_store(config.store)
        assert isinstance(local, MemoryStore)
        mesh = Mesh(fleet_id, str(index), nodes(workers), applier(local), owner=os.getppid())
        try:
            mesh.listen()
        except OSError as exc:
            print(f"prefixpin: worker {index}: cannot listen for the other workers: {exc}", file=sys.stderr)
            return 3
        replica = ReplicaStore(local, mesh)
    try:
        listener = _listen_socket(host, port)
    except OSError as exc:
        print(f"prefixpin: worker {index}: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 3
    fleet = Fleet(sock, index, replica)
    return run_uvicorn(config, sockets=[listener], fleet=fleet, store=replica, banner=False)


# --- the serve process ------------------------------------------------------------------


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.link: Link | None = None
        self.ready = asyncio.get_running_loop().create_future()
        self.started_at = 0.0
        self.restarts = 0


class Supervisor:
    """Starts, watches, restarts and stops the workers; answers their calls."""

    def __init__(self, config: Config, workers: int, host: str, port: int) -> None:
        self.config = config
        self.n = workers
        self.host = host
        self.port = port
        self.store: MemoryStore | None = None
        self.fleet = secrets.token_hex(8)  # names the store's sockets: unique to this server
        self.mesh: Mesh | None = None
        self.workers: list[_Worker] = []
        self.stopping = False

    async def run(self) -> int:
        from proxy.store import open_store

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        drainer = None
        if self.config.store.backend == "memory":
            store = open_store(self.config.store)
            assert isinstance(store, MemoryStore)
            self.store = store
            self.mesh = Mesh(self.fleet, HUB, (), applier(store), owner=os.getpid())
            self.mesh.listen()
            drainer = loop.create_task(self._drain(self.mesh))
        self.workers = [_Worker(i) for i in range(self.n)]
        for w in self.workers:
            await self._spawn(w)
        started = await self._await_ready(stop)
        if started:
            log.info(
                "prefixpin serving on http://%s:%d -> %s (workers: %d, store: %s, packs: %s)",
                self.host,
                self.port,
                redact(self.config.upstream.url),
                self.n,
                self.config.store.backend,
                ",".join(self.config.canonicalize.packs),
            )
            watch = loop.create_task(self._watch())
            await stop.wait()
            watch.cancel()
        self.stopping = True
        await self._stop_all()
        if drainer is not None:
            drainer.cancel()
        if self.mesh is not None:
            self.mesh.close()
        if self.store is not None:
            await self.store.close()
        return 0 if started else 3

    @staticmethod
    async def _drain(mesh: Mesh) -> None:
        """Apply the workers' writes to our copy, in batches (nothing waits on it
        but a starting worker, which drains first)."""
        while True:
            await asyncio.sleep(_DRAIN_S)
            try:
                mesh.drain()
            except Exception:
                log.exception("the serve process's store copy: reading the workers' writes failed")

    async def _await_ready(self, stop: asyncio.Event) -> bool:
        deadline = time.monotonic() + _STARTUP_S
        while time.monotonic() < deadline and not stop.is_set():
            if all(w.ready.done() for w in self.workers):
                return True
            for w in self.workers:
                if w.proc is not None and w.proc.poll() is not None and not w.ready.done():
                    log.error("worker %d exited with %s before it was ready", w.index, w.proc.returncode)
                    return False
            await asyncio.sleep(0.05)
        if not stop.is_set():
            log.error("the workers were not ready within %.0f s", _STARTUP_S)
        return False

    async def _spawn(self, w: _Worker) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # where the proxy package is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        w.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.workers", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        w.started_at = time.monotonic()
        w.ready = asyncio.get_running_loop().create_future()
        hello = (self.config, w.index, self.n, self.host, self.port, self.fleet)
        ours.sendall(encode(0, 0, "hello", hello))
        w.link = await Link.open(ours, functools.partial(self._handle, w), name=f"worker {w.index}")

    def _handle(self, w: _Worker, name: str, args: tuple[Any, ...]) -> Any:
        if name == "store.snapshot":
            if self.store is None or self.mesh is None:
                raise ValueError("this server's store is not the embedded one")
            self.mesh.drain()  # every write a worker made before this one listened
            return self.store.dump()
        if name == "ready":
            if not w.ready.done():
                w.ready.set_result(args[0])
            return None
        if name == "metrics":
            return self._scrape()  # awaited by the link, which goes on reading
        raise ValueError(f"unknown operation {name!r}")

    async def _scrape(self) -> bytes:
        links = [w.link for w in self.workers if w.link is not None and not w.link.closed and w.ready.done()]
        results = await asyncio.gather(
            *(link.call("collect", timeout=_SCRAPE_S) for link in links), return_exceptions=True
        )
        scrapes = [r for r in results if isinstance(r, list)]
        if len(scrapes) < len(links):
            log.warning("/metrics: %d of %d workers did not answer", len(links) - len(scrapes), len(links))
        return exposition(scrapes)

    async def _watch(self) -> None:
        """Restart a worker that exited, after a pause that doubles while it keeps failing."""
        while True:
            await asyncio.sleep(0.2)
            for w in self.workers:
                if w.proc is None or w.proc.poll() is None:
                    continue
                lived = time.monotonic() - w.started_at
                w.restarts = 0 if lived > 30 else w.restarts + 1
                pause = min(0.1 * 2**w.restarts, 10.0)
                log.error(
                    "worker %d (pid %d) exited with %s; restarting it in %.1f s",
                    w.index,
                    w.proc.pid,
                    w.proc.returncode,
                    pause,
                )
                if w.link is not None:
                    w.link.close()
                w.proc = None
                await asyncio.sleep(pause)
                await self._spawn(w)

    async def _stop_all(self) -> None:
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                log.warning("worker pid %d did not stop in %.0f s; killing it", p.pid, _STOP_S)
                p.kill()
                p.wait()
        for w in self.workers:
            if w.link is not None:
                w.link.close()


def serve(config: Config, workers: int) -> int:
    """``prefixpin serve`` with ``workers`` > 1 (the serve process)."""
    host, port = config.listen.host, config.listen.port
    try:
        probe = claim(host, port)
    except OSError as exc:
        print(f"prefixpin: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 3
    port = probe.getsockname()[1]
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        return int(run(Supervisor(config, workers, host, port).run()))
    finally:
        probe.close()


if __name__ == "__main__":
    sys.exit(worker_main(int(sys.argv[1])))
