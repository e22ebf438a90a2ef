"""LiteLLM's proxy as a target (on request: ``--targets ...,litellm``).

LiteLLM 1.86.0 from ``requirements-litellm.lock`` (hash-pinned; later releases
need a ``certifi`` newer than the reachable registry has), installed into its
own venv under ``~/.cache/prefixpin/litellm-venv`` and re-installed when the
lock changes.  One worker, no database, one model routed to the upstream; it
refuses to start without a master key, and it fetches its cost map from the
internet at import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.overhead.body import MODEL
from benchmarks.overhead.targets import CLIENT_KEY, Target, one_line
from benchmarks.overhead.tools import CACHE, Unavailable
from tests.infra.procs import REPO, Proc, free_port

VENV = CACHE / "litellm-venv"
LOCK = REPO / "requirements-litellm.lock"


def python() -> Path:
    return VENV / "bin" / "python"


def _lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]


def installed() -> bool:
    stamp = VENV / ".prefixpin-lock"
    return python().exists() and stamp.exists() and stamp.read_text().strip() == _lock_digest()


def version() -> str:
    if not installed():
        return "not installed"
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    done = subprocess.run([str(python()), "-c", code], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or "unknown"


def ensure(*, install: bool) -> Path:
    """The venv's ``litellm`` executable, installed from the hashed lock if missing or stale."""
    exe = VENV / "bin" / "litellm"
    if installed() and exe.exists():
        return exe
    if not install:
        raise Unavailable(f"LiteLLM is not installed in {VENV} (run without --no-install)")
    uv = shutil.which("uv")
    if uv:
        steps = [
            [uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(VENV)],
            [uv, "pip", "install", "-q", "--python", str(python()), "--require-hashes", "-r", str(LOCK)],
        ]
    else:
        steps = [
            [sys.executable, "-m", "venv", str(VENV)],
            [str(python()), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(LOCK)],
        ]
    print(f"installing LiteLLM from {LOCK.name} into {VENV} ...", file=sys.stderr, flush=True)
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"{Path(step[0]).name} {' '.join(step[1:3])} failed: {one_line(done.stderr[-2000:])}")
    if not exe.exists():
        raise Unavailable("the litellm executable is missing after the install")
    (VENV / ".prefixpin-lock").write_text(_lock_digest())
    return exe


def target(upstream: str, work: Path, *, install: bool) -> Target:
    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        exe = ensure(install=install)
        config = work / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n"
            "      api_key: sk-upstream-unused\n"
            "general_settings:\n"
            f"  master_key: {CLIENT_KEY}\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
        )
        port = free_port()
        argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        proc = Proc("litellm", argv, log_dir, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(base + "/health/liveliness", timeout=120)
        except RuntimeError as exc:
            proc.stop()
            raise Unavailable(f"LiteLLM did not start: {one_line(str(exc))}") from exc
        return [proc], base

    return Target("litellm", launch)


__all__ = ["ensure", "installed", "target", "version"]
