"""The cache venv the compared servers and clients run in.

Nothing here is a dependency of prefixpin: the libraries are installed, exactly
pinned, into ``~/.cache/prefixpin/bench-http/venv-<hash>`` (the hash of the pins and
of ``requirements.lock``) on the first run and reused after.  prefixpin itself runs
there from this tree (``PYTHONPATH``), with its own locked runtime dependencies.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.overhead.tools import CACHE
from tests.infra.llama import cache_lock
from tests.infra.procs import REPO

PINS = (
    "uvicorn==0.54.0",  # --http httptools and --http h11
    "h11==0.16.0",
    "granian==2.8.7",  # Rust (hyper) server
    "hypercorn==0.18.0",
    "aiohttp==3.14.5",
    "pyreqwest==0.15.1",  # Rust (reqwest / hyper) client
)


def python() -> Path:
    """The cache venv's interpreter, built when missing."""
    lock = (REPO / "requirements.lock").read_bytes()
    digest = hashlib.sha256(lock + "\n".join(PINS).encode() + sys.version.encode()).hexdigest()[:12]
    venv = CACHE / "bench-http" / f"venv-{digest}"
    exe = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return exe
    with cache_lock(f"bench-http-{digest}"):  # another run may be building it
        if (venv / ".complete").exists():
            return exe
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--require-hashes", "-r", str(REPO / "requirements.lock")], check=True)
        subprocess.run([*pip, *PINS], check=True)
        (venv / ".complete").touch()
    return exe


def environ() -> dict[str, str]:
    """The environment a cache-venv process runs in: this tree importable."""
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


__all__ = ["PINS", "environ", "python"]
