"""The servers compared: ours (``proxy.front``), uvicorn's two protocols, granian, hypercorn.

Each serves one ASGI app (``apps.prefixpin`` for the figures, ``apps.probe`` for the
behaviours) as one process with one worker, on uvloop where it has a choice, from
the cache venv (:mod:`benchmarks.http.env`).  The cost of a request is the CPU time
of the server's whole session (granian's workers included) over the requests wrk
completed in that time.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.http import env
from tests.infra.procs import Proc, free_port

SERVERS = ("prefixpin", "uvicorn-httptools", "uvicorn-h11", "granian", "hypercorn")
TICK = os.sysconf("SC_CLK_TCK")


def argv(server: str, app: str, port: int) -> list[str]:
    """The command that serves ``app`` (module:attribute) on ``port`` with ``server``."""
    py = str(env.python())
    quiet = ["--log-level", "warning"]
    if server == "prefixpin":
        return [py, "-m", "benchmarks.http.front", app, "--port", str(port)]
    if server.startswith("uvicorn-"):
        proto = server.removeprefix("uvicorn-")
        return [py, "-m", "uvicorn", app, "--http", proto, "--loop", "uvloop", "--port", str(port), "--no-access-log"]
    if server == "granian":
        flags = ["--interface", "asgi", "--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-ws"]
        return [py, "-m", "granian", *flags, *quiet, app]
    if server == "hypercorn":
        flags = ["--bind", f"127.0.0.1:{port}", "--worker-class", "uvloop", "--workers", "1"]
        return [py, "-m", "hypercorn", *flags, *quiet, app]
    raise ValueError(server)


@dataclass
class Running:
    name: str
    proc: Proc
    base: str
    port: int

    def cpu_s(self) -> float:
        """CPU seconds used so far by every process of the server's session."""
        total = 0
        sid = self.proc.popen.pid
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:  # the session id
                    total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / TICK

    def rss(self) -> int:
        """Resident bytes of the session's processes."""
        total = 0
        sid = self.proc.popen.pid
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return total


@contextlib.contextmanager
def running(
    server: str, app: str, log_dir: Path, environ: dict[str, str], nofile: int | None = None
) -> Iterator[Running]:
    """``server`` serving ``app`` until the block ends; ``nofile``: its open-file limit."""
    port = free_port()
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    if nofile is not None:  # inherited by the child (Proc starts it now)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, old[1]))
    try:
        proc = Proc(f"{server}-{port}", argv(server, app, port), log_dir, env={**env.environ(), **environ})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_listening(proc, port)
        yield Running(server, proc, base, port)
    finally:
        proc.stop()


def wait_listening(proc: Proc, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} does not listen on {port}:\n{proc.log_tail()}")


__all__ = ["SERVERS", "Running", "argv", "running"]
