"""``./scripts/image`` as the first command after a clone: no llama-server built yet.

With ``PREFIXPIN_CACHE`` pointed at an empty directory, the script builds llama-server
(its build's output on stderr, the binary's path alone on stdout) and the model into
it, then the images.  Slow: a cold llama-server build (~6 min on 2 quiet cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import IMAGES, in_ci, run
from tests.infra.llama import LLAMA_COMMIT
from tests.infra.procs import REPO

pytestmark = [pytest.mark.deploy, pytest.mark.slow]


def test_image_builds_with_an_empty_cache(tmp_path: Path, log_dir: Path) -> None:
    if shutil.which("podman") is None and os.geteuid() != 0 and not in_ci():
        pytest.skip("podman is not installed and installing it needs root (apt-get install podman)")
    cache = tmp_path / "cache"
    log = log_dir / "scripts-image-empty-cache.log"
    env = {**os.environ, "PREFIXPIN_CACHE": str(cache)}
    with open(log, "w") as fh:
        proc = subprocess.run(
            [str(REPO / "scripts" / "image")],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=5400,
        )
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, f"./scripts/image failed ({proc.returncode}):\n{output[-4000:]}"
    assert "File name too long" not in output
    server = cache / "llama" / LLAMA_COMMIT / "llama-server"
    assert server.is_file() and os.access(server, os.X_OK), "built into the empty cache"
    for image in IMAGES:
        run(["podman", "image", "exists", image])
    version = run(["podman", "run", "--rm", IMAGES[1], "--version"])
    assert LLAMA_COMMIT in version.stdout + version.stderr
