"""What the benchmark measures: the targets in front of the instant upstream.

Every target is a set of real child processes on loopback (``tests.infra.procs``):

    direct            load generator -> upstream (the generator's and upstream's ceiling)
    nginx             proxy_pass, upstream keepalive, proxy_buffering off, one worker (nginx.py)
    python-floor      a bare proxy on uvloop and httptools: what Python costs to forward (floor.py;
                      on request)
    prefixpin         ``prefixpin serve --upstream <upstream>`` (default config), from this tree
    prefixpin@REF     the same, running the code of git revision REF (``--compare-ref``)
    prefixpin-trace   the default config, every request recorded (``trace.path``, rotated at
                      64 MiB, one old file kept; on request)
    prefixpin-auto    the default config but ``listen.workers: auto`` (on request)
    prefixpin-bypass  the prefixpin process, every request sent with ``x-prefixpin-bypass: 1``
                      (no parse, no canonicalization, no store): its HTTP shell (on request)
    litellm           LiteLLM's proxy (litellm.py; on request)

A target that cannot be had carries ``reason`` instead of a URL, and the report
shows the row as ``unavailable: <reason>``.  The Go upstream (``start_upstream``)
serves the other benchmarks (memory, big body), which need a streaming upstream.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.overhead.tools import Unavailable, go_binary, prioritize
from tests.infra.procs import REPO, Proc, free_port, start_prefixpin

CHAT = "/v1/chat/completions"
CLIENT_KEY = "sk-bench-master"  # LiteLLM's master key; one tenant for prefixpin
CLIENT_HEADERS = {"Authorization": f"Bearer {CLIENT_KEY}"}  # sent to every target alike

Launch = Callable[[Path], tuple[list[Proc], str]]


@dataclass
class Target:
    """One row of the table: its processes, its base URL, or why it is unavailable."""

    name: str
    launch: Launch | None = None
    base: str | None = None
    reason: str | None = None
    procs: list[Proc] = field(default_factory=list)  # owned: stopped and restarted with the target
    watch: list[Proc] = field(default_factory=list)  # whose CPU time is the target's cost
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request, on top of CLIENT_HEADERS
    alias_of: Target | None = None  # the same processes, driven differently (headers)
    priority: int | None = None  # the scheduling weight of its processes' sessions (tools.prioritize)

    @property
    def url(self) -> str:
        return f"{self.base}{CHAT}"

    def start(self, log_dir: Path) -> None:
        if self.alias_of is not None:
            self.base, self.reason, self.watch = self.alias_of.base, self.alias_of.reason, self.alias_of.watch
            return
        if self.launch is None:
            return
        try:
            self.procs, self.base = self.launch(log_dir)
            self.watch = list(self.procs)
            for proc in self.procs:
                prioritize(proc.popen.pid, self.priority)
        except (Unavailable, RuntimeError, OSError) as exc:
            self.reason = one_line(str(exc))
            self.base = None

    def restart(self, log_dir: Path) -> None:
        if self.alias_of is not None:
            self.alias_of.restart(log_dir)
        else:
            self.stop()
        self.start(log_dir)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs = []

    def cpu_seconds(self) -> float:
        """CPU time used so far by the watched processes and their process groups."""
        watch = self.alias_of.watch if self.alias_of is not None else self.watch
        return sum(group_cpu_seconds(p.popen.pid) for p in watch if p.alive())


def one_line(text: str) -> str:
    """The first non-empty line of ``text``, at most 200 characters (for a report cell)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "unknown error")[:200]


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in process group ``pgid`` (children started their own)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields[0] is field 3 (state); pgrp is field 5
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


# -- the upstreams --------------------------------------------------------------------------
def start_upstream(log_dir: Path) -> tuple[Proc, str]:
    """The instant Go upstream (``upstream/main.go``): non-streamed and streamed answers."""
    binary = go_binary("upstream")
    port = free_port()
    proc = Proc("upstream", [str(binary), "-port", str(port)], log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health", timeout=20)
    return proc, base


def direct(upstream: Proc, base: str) -> Target:
    """The load generator straight to the upstream: what nothing in between would give."""
    return Target("direct", base=base, watch=[upstream])


# -- prefixpin -------------------------------------------------------------------------------
def prefixpin(
    upstream: str,
    *,
    name: str = "prefixpin",
    source: Path | None = None,
    config: Path | None = None,
    env: dict[str, str] | None = None,
) -> Target:
    """``prefixpin serve`` of this checkout (``python -m proxy.cli`` in it, not the
    ``prefixpin`` on PATH, which may be another tree's editable install); ``source``: a
    checkout of another revision, whose code runs instead; ``config``: a config file
    (default: none, the default config); ``env``: set in its environment."""

    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        proc, base = start_prefixpin(
            log_dir, upstream=upstream, name=name.replace("@", "-"), source=source or REPO, config=config, env=env
        )
        return [proc], base

    return Target(name, launch)


def checkout(ref: str, dest: Path) -> Path:
    """The tree of ``ref`` exported into ``dest`` (``git archive``: no worktree, no index touched)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True)
    if archive.returncode != 0:
        raise Unavailable(f"git archive {ref}: {one_line(archive.stderr.decode(errors='replace'))}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def prefixpin_bypass(pp: Target, *, name: str = "prefixpin-bypass") -> Target:
    """The same prefixpin process with ``x-prefixpin-bypass: 1``: its HTTP shell alone, no canonicalization."""
    return Target(name, headers={"x-prefixpin-bypass": "1"}, alias_of=pp)
