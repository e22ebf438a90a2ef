"""Real processes on loopback for tests and benchmarks: free ports, start, wait, stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from tests.infra import llama

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process with its output in a log file; ``stop`` is idempotent."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
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
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(url, timeout=2, trust_env=False)
                if r.status_code in ok:
                    return
                last = r.status_code
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout}s ({last}):\n{self.log_tail()}")

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
    """``prefixpin serve`` on a free port; ``source``: a checkout whose code runs instead of this one's."""
    port = free_port()
    argv = [*prefixpin_argv(source), "serve", "--upstream", upstream, "--port", str(port)]
    if config is not None:
        argv += ["--config", str(config)]
    proc = Proc(name, argv, log_dir, env={"PYTHONUNBUFFERED": "1", **(env or {})}, cwd=source)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/healthz", timeout=30)
    return proc, base


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
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not start:\n{proc.log_tail()}")
