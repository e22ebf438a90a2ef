"""A cache-aware router peer for the affinity benchmark: SGLang's router (``sglang-router``
from PyPI, a Rust binary in a wheel) in a throwaway venv under ~/.cache/prefixpin.

It fronts llama-server replicas as its workers and routes each request to the one
whose radix tree of past request texts matches the longest prefix (``cache_aware``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.infra.llama import CACHE
from tests.infra.procs import Proc, free_port

PACKAGE = "sglang-router==0.3.2"
VENV = CACHE / "sglang-router-0.3.2"


def python() -> Path:
    return VENV / "bin" / "python"


def ensure(install: bool) -> str | None:
    """None when the router is there (installed now if ``install``), else why not."""
    if python().exists():
        return None
    if not install:
        return f"{PACKAGE} is not installed in {VENV} (run without --no-install)"
    steps = (
        [sys.executable, "-m", "venv", str(VENV)],
        [str(python()), "-m", "pip", "install", "--quiet", "--only-binary=:all:", PACKAGE],
    )
    for argv in steps:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            subprocess.run(["rm", "-rf", str(VENV)], check=False)
            return f"{' '.join(argv[-2:])} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-600:]}"
    return None


def start(log_dir: Path, workers: list[str], *, policy: str = "cache_aware", name: str = "router") -> tuple[Proc, str]:
    port = free_port()
    argv = [str(python()), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *workers, "--policy", policy, "--log-level", "warn"]
    proc = Proc(name, argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health", timeout=60)
    return proc, base
