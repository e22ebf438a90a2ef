"""What the benchmark measures: the instant upstream and the proxies in front of it.

Every target is a set of real child processes on loopback (``tests.infra.procs``):

    direct            load generator -> upstream
    prefixpin         ``prefixpin serve --upstream <upstream>`` (default config)
    prefixpin@REF     the same, running the code of git revision REF (``--compare-ref``)
    prefixpin-auto    the default config but ``listen.workers: auto`` (a worker per CPU; on request)
    prefixpin-bypass  the same process, every request sent with ``x-prefixpin-bypass: 1``
                      (no parse, no canonicalization, no store): the cost of its HTTP shell
    nginx             proxy_pass, upstream keepalive, proxy_buffering off (nginx.conf.tmpl)
    litellm           LiteLLM proxy 1.86.0 from requirements-litellm.lock, in its own venv

A target that cannot be had (nginx not installable, LiteLLM not installable or
not starting) carries ``reason`` instead of a URL, and the report shows the row
as ``unavailable: <reason>``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from benchmarks.overhead.body import MODEL
from benchmarks.overhead.tools import CACHE, HERE, Unavailable, ensure_deb, go_binary
from tests.infra.procs import REPO, Proc, free_port, start_prefixpin

CHAT = "/v1/chat/completions"
LITELLM_VENV = CACHE / "litellm-venv"
LITELLM_LOCK = REPO / "requirements-litellm.lock"
LITELLM_KEY = "sk-bench-master"  # the proxy refuses to start without a master key
CLIENT_HEADERS = {"Authorization": f"Bearer {LITELLM_KEY}"}  # sent to every target alike

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
        except (Unavailable, RuntimeError, OSError) as exc:
            self.reason = _one_line(str(exc))
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


def _one_line(text: str) -> str:
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


# -- the upstream --------------------------------------------------------------------------
def start_upstream(log_dir: Path) -> tuple[Proc, str]:
    binary = go_binary("upstream")
    port = free_port()
    proc = Proc("upstream", [str(binary), "-port", str(port)], log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health", timeout=20)
    return proc, base


def direct(upstream: Proc, base: str) -> Target:
    return Target("direct", base=base, watch=[upstream])


# -- prefixpin -------------------------------------------------------------------------------
def prefixpin(
    upstream: str, *, name: str = "prefixpin", source: Path | None = None, config: Path | None = None
) -> Target:
    """``prefixpin serve``; ``source``: a checkout of another revision, whose code runs instead;
    ``config``: a config file (default: none, the default config)."""

    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        proc, base = start_prefixpin(
            log_dir, upstream=upstream, name=name.replace("@", "-"), source=source, config=config
        )
        return [proc], base

    return Target(name, launch)


def checkout(ref: str, dest: Path) -> Path:
    """The tree of ``ref`` exported into ``dest`` (``git archive``: no worktree, no index touched)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True)
    if archive.returncode != 0:
        raise Unavailable(f"git archive {ref}: {_one_line(archive.stderr.decode(errors='replace'))}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def prefixpin_bypass(pp: Target, *, name: str = "prefixpin-bypass") -> Target:
    """The same prefixpin process with ``x-prefixpin-bypass: 1``: its HTTP shell alone, no canonicalization."""
    return Target(name, headers={"x-prefixpin-bypass": "1"}, alias_of=pp)


# -- nginx -----------------------------------------------------------------------------------
def nginx(upstream: str, work: Path) -> Target:
    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        binary = ensure_deb("nginx", "nginx-light", candidates=("/usr/sbin/nginx",))
        prefix = work / "nginx"
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        port = free_port()
        conf = Template((HERE / "nginx.conf.tmpl").read_text()).substitute(
            prefix=prefix, port=port, upstream_port=upstream.rsplit(":", 1)[1]
        )
        (prefix / "nginx.conf").write_text(conf)
        argv = [binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")]
        proc = Proc("nginx", argv, log_dir)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/health", timeout=20)
        except RuntimeError as exc:
            proc.stop()
            tail = (prefix / "error.log").read_text(errors="replace")[-300:] if (prefix / "error.log").exists() else ""
            raise Unavailable(f"nginx did not start: {_one_line(str(exc))} {tail}") from exc
        return [proc], base

    return Target("nginx", launch)


# -- LiteLLM ---------------------------------------------------------------------------------
def litellm_python() -> Path:
    return LITELLM_VENV / "bin" / "python"


def _lock_digest() -> str:
    return hashlib.sha256(LITELLM_LOCK.read_bytes()).hexdigest()[:16]


def litellm_installed() -> bool:
    stamp = LITELLM_VENV / ".prefixpin-lock"
    return litellm_python().exists() and stamp.exists() and stamp.read_text().strip() == _lock_digest()


def ensure_litellm(*, install: bool) -> Path:
    """The venv's ``litellm`` executable, installed from the hashed lock if missing or stale."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if litellm_installed() and exe.exists():
        return exe
    if not install:
        raise Unavailable(f"LiteLLM is not installed in {LITELLM_VENV} (a full run installs it)")
    uv = shutil.which("uv")
    if uv:
        steps = [
            [uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(LITELLM_VENV)],
            [
                uv,
                "pip",
                "install",
                "-q",
                "--python",
                str(litellm_python()),
                "--require-hashes",
                "-r",
                str(LITELLM_LOCK),
            ],
        ]
    else:
        steps = [
            [sys.executable, "-m", "venv", str(LITELLM_VENV)],
            [str(litellm_python()), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(LITELLM_LOCK)],
        ]
    print(f"installing LiteLLM from {LITELLM_LOCK.name} into {LITELLM_VENV} ...", file=sys.stderr, flush=True)
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"{Path(step[0]).name} {' '.join(step[1:3])} failed: {_one_line(done.stderr[-2000:])}")
    if not exe.exists():
        raise Unavailable("the litellm executable is missing after the install")
    (LITELLM_VENV / ".prefixpin-lock").write_text(_lock_digest())
    return exe


def litellm(upstream: str, work: Path, *, install: bool) -> Target:
    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        exe = ensure_litellm(install=install)
        config = work / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n"
            "      api_key: sk-upstream-unused\n"
            "general_settings:\n"
            f"  master_key: {LITELLM_KEY}\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
        )
        port = free_port()
        argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches the cost map at import and stalls here
            "LITELLM_LOG": "ERROR",
        }
        proc = Proc("litellm", argv, log_dir, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/health/liveliness", timeout=120)
        except RuntimeError as exc:
            proc.stop()
            raise Unavailable(f"LiteLLM did not start: {_one_line(str(exc))}") from exc
        return [proc], base

    return Target("litellm", launch)
