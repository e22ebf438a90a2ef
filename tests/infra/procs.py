"""Real processes on loopback for tests and benchmarks: free ports, start, wait, stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx

from tests.infra import llama
from tests.infra.wait import WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` different free ports.  Each :func:`free_port` closes its socket before the
    next call, so two calls can return the same port (two cluster nodes then meant to
    listen on one port: the second exits and the first answers for both); these are
    held bound together until all are found."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port nothing listens on, for the block: bound and never listening, so a
    connection to it is refused, and no process (a prefixpin started in the block
    included) can take it as it could one :func:`free_port` found free."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _new_log(log_dir: Path, name: str) -> tuple[Path, IO[bytes]]:
    """A log file of this process's own: ``name.log``, or ``name.2.log``, ... when a
    process of that name logged there before (names made from a free port repeat within
    a session, and an earlier process's lines would be read as this one's)."""
    n = 1
    while True:
        path = log_dir / (f"{name}.log" if n == 1 else f"{name}.{n}.log")
        try:
            return path, open(path, "xb")  # closed in Proc.stop()
        except FileExistsError:
            n += 1


class Proc:
    """A child process with its output in a log file; ``stop`` is idempotent."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path, self._log = _new_log(log_dir, name)
        full_env = {**os.environ, **(env or {})}
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
            cwd=cwd,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float = 60.0, ok: tuple[int, ...] = (200,)) -> None:
        """Until ``url`` answers a status in ``ok``; RuntimeError if the process exits first
        or after ``timeout``."""
        last: Any = None

        def answers() -> bool:
            nonlocal last
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(url, timeout=2, trust_env=False)
            except httpx.HTTPError as exc:
                last = exc
                return False
            last = r.status_code
            return r.status_code in ok

        try:
            wait_until(answers, timeout=timeout, interval=0.1)
        except WaitTimeout:
            tail = self.log_tail()
            raise RuntimeError(f"{self.name} not ready at {url} after {timeout}s ({last}):\n{tail}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        if not self._log.closed:
            self._log.close()


def prefixpin_logs(log_dir: Path) -> str:
    """The output of every ``prefixpin serve`` of the session so far (``serve`` in
    tests/conftest.py names their logs prefixpin-*).  With ``log.access`` on, a
    request's access line is written once it is answered, after whatever the process
    logged about it: a test waits for its last request's line before it reads them."""
    return "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("prefixpin-*.log")))


def prefixpin_argv(source: Path | None = None) -> list[str]:
    """``prefixpin``, or, to run the code of another checkout (``source``), ``python -m proxy.cli`` in it."""
    exe = None if source is not None else shutil.which("prefixpin")
    return [exe] if exe else [sys.executable, "-m", "proxy.cli"]


def start_prefixpin(
    log_dir: Path,
    *,
    upstream: str,
    config: Path | None = None,
    env: dict[str, str] | None = None,
    name: str = "prefixpin",
    source: Path | None = None,
) -> tuple[Proc, str]:
    """``prefixpin serve`` on a free port; ``source``: a checkout whose code runs instead of this one's.

    A port found free can be taken by another process before prefixpin binds it (other
    suites on the machine): then it exits saying so, and another port is tried."""
    for attempt in range(3):
        port = free_port()
        argv = [*prefixpin_argv(source), "serve", "--upstream", upstream, "--port", str(port)]
        if config is not None:
            argv += ["--config", str(config)]
        proc = Proc(name, argv, log_dir, env={"PYTHONUNBUFFERED": "1", **(env or {})}, cwd=source)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/healthz", timeout=30)
        except RuntimeError:
            proc.stop()
            if attempt < 2 and not proc.alive() and "Address already in use" in proc.log_tail(5):
                continue
            raise
        return proc, base
    raise AssertionError("unreachable")


DEFAULTS: dict[str, Any] = {"parallel": None, "cache_ram": None}  # start_llama(**DEFAULTS): as users start it


def start_llama(
    log_dir: Path,
    *,
    layers: int = 2,
    embd: int = 128,
    ctx: int = 16384,
    parallel: int | None = 1,
    cache_ram: int | None = 0,
    name: str = "llama-server",
    threads: int = 2,
    port: int | None = None,
) -> tuple[Proc, str]:
    """``parallel`` (``--parallel``: fixed slots, each its own KV) and ``cache_ram``
    (``--cache-ram`` MiB; 0: no host-RAM prompt cache) default to the setup where each
    slot is its cache; None leaves the flag out, as users start it: ``--parallel``
    auto (4 slots sharing one unified KV pool) and an 8 GiB RAM prompt cache that
    keeps idle slots' prompts and restores them by content (:data:`DEFAULTS`).
    ``threads``: ``-t``; replicas sharing this 2-core machine take 1 each (ggml's
    worker threads spin while they wait, so 2 x 2 threads on 2 cores crawl).
    ``port``: a given one (a replica restarted where it was), else a free one."""
    server = llama.ensure_server()
    model = llama.ensure_model(layers, embd)
    port = port or free_port()
    argv = [
        str(server),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx),
        "-t",
        str(threads),
        "--no-ui",
        "--metrics",
    ]
    if parallel is not None:
        argv += ["--parallel", str(parallel)]
    if cache_ram is not None:
        argv += ["--cache-ram", str(cache_ram)]
    proc = Proc(name, argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health", timeout=120)
    return proc, base


def redis_server_path() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(path).exists():
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    return path


def start_redis(log_dir: Path, port: int | None = None, name: str = "redis-server") -> tuple[Proc, str]:
    port = port or free_port()
    argv = [redis_server_path(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = Proc(name, argv, log_dir)

    def answers() -> bool:
        """Does *this* redis-server answer on ``port``?  (Another one may hold a port
        that was free a moment ago: this one then exits, and its log says why.)"""
        if not proc.alive():
            raise RuntimeError(f"redis-server exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            return _redis_pid(port) == proc.popen.pid
        except OSError:
            return False

    try:
        wait_until(answers, timeout=20, interval=0.05)
    except WaitTimeout:
        raise RuntimeError(f"redis-server did not start:\n{proc.log_tail()}") from None
    return proc, f"redis://127.0.0.1:{port}/0"


def _redis_pid(port: int) -> int | None:
    """The ``process_id`` of the redis-server answering on ``port`` (``INFO server``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"INFO server\r\n")
        data = b""
        while b"process_id:" not in data or not data.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
    for line in data.split(b"\r\n"):
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None
