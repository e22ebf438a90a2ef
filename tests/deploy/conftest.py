"""Deployment tests: the images ``./scripts/image`` builds, run with podman.

The ``images`` fixture runs ``./scripts/image`` once per session (it installs podman
and friends from Debian when missing, and rebuilds only images whose inputs
changed). In CI (``CI=true``) a missing or broken podman fails these tests; on a
developer machine without podman and without root to install it they are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.infra.procs import REPO

IMAGES = [
    "localhost/prefixpin:latest",
    "localhost/prefixpin-llama:latest",
    "localhost/prefixpin-redis:latest",
    "localhost/prefixpin-prometheus:latest",
]


def local(port: int) -> str:
    """The base URL of a port published on loopback."""
    return f"http://127.0.0.1:{port}"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def run(
    argv: list[str], *, timeout: float = 300, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` in the repository; ``env``: added to this process's environment."""
    out = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="session")
def images(log_dir: Path) -> list[str]:
    """Build (or find up to date) the localhost/prefixpin* images with ./scripts/image."""
    if shutil.which("podman") is None and os.geteuid() != 0 and not in_ci():
        pytest.skip("podman is not installed and installing it needs root (apt-get install podman)")
    log = log_dir / "scripts-image.log"
    with open(log, "w") as fh:
        proc = subprocess.run(
            [str(REPO / "scripts" / "image")],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=3600,
        )
    if proc.returncode != 0:
        raise AssertionError(f"./scripts/image failed ({proc.returncode}):\n{log.read_text()[-4000:]}")
    for image in IMAGES:
        run(["podman", "image", "exists", image])
    return IMAGES


def running_containers(**labels: str) -> list[str]:
    argv = ["podman", "ps", "--format", "{{.Names}}"]
    for key, value in labels.items():
        argv += ["--filter", f"label={key}={value}"]
    return run(argv).stdout.split()


def wait_ready(base: str, timeout: float = 180.0) -> None:
    """Poll ``/readyz`` (store and upstream answer) until 200."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(base + "/readyz", timeout=3, trust_env=False)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(1)
    raise AssertionError(f"{base}/readyz not ready after {timeout}s: {last}")


def save_logs(log_dir: Path, names: list[str]) -> None:
    """Keep the named containers' output in the test's log dir (call before removing them)."""
    for name in names:
        out = run(["podman", "logs", name], check=False)
        (log_dir / f"podman-{name}.log").write_text(out.stdout + out.stderr)


def inspect(name: str) -> dict[str, Any]:
    return dict(json.loads(run(["podman", "inspect", name]).stdout)[0])
