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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import hermes
from tests.conftest import track
from tests.infra.procs import REPO

IMAGES = ["localhost/prefixpin:latest", "localhost/prefixpin-llama:latest",
          "localhost/prefixpin-redis:latest", "localhost/prefixpin-prometheus:latest"]  # fmt: skip
PROXY = "http://127.0.0.1:8787"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def run(argv: list[str], *, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
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
        proc = subprocess.run([str(REPO / "scripts" / "image")], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=3600)  # fmt: skip
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


def two_turns(base: str) -> tuple[Any, Any, list[str]]:
    """Two turns of a hermes conversation whose memory counter and minute change between
    turns, through prefixpin with the openai SDK; returns both usages and the roles."""
    client = track(openai.OpenAI(base_url=base + "/v1", api_key="sk-deploy", max_retries=0, timeout=120))
    tools = hermes.tools_full()
    history: list[dict[str, Any]] = []
    usages, roles = [], []
    turns = [(49, "1,085", "02:30 PM", "What does the test suite cover?"),
             (50, "1,102", "02:31 PM", "Run the unit tests and summarise failures.")]  # fmt: skip
    for pct, chars, minute, user in turns:
        system = hermes.system_prompt(pct=pct, chars=chars, minute=minute, filler=8)
        messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": user}]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, tools=tools, max_tokens=6  # type: ignore[arg-type]
        )
        reply = raw.parse()
        usages.append(reply.usage)
        roles.append(raw.headers.get("x-prefixpin-role", ""))
        history += [{"role": "user", "content": user},
                    {"role": "assistant", "content": reply.choices[0].message.content or ""}]  # fmt: skip
    return usages[0], usages[1], roles


def cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


@pytest.fixture
def podman_logs(log_dir: Path) -> Iterator[list[str]]:
    """Names of containers whose logs are saved to log_dir when the test ends."""
    names: list[str] = []
    yield names
    for name in names:
        out = run(["podman", "logs", name], check=False)
        (log_dir / f"podman-{name}.log").write_text(out.stdout + out.stderr)


def inspect(name: str) -> dict[str, Any]:
    return dict(json.loads(run(["podman", "inspect", name]).stdout)[0])
