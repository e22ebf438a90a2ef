"""Build a real, CPU-only ``llama-server`` and a tiny random-weight GGUF for tests.

Everything comes from PyPI: llama.cpp is vendored (with ``tools/server``) in the
``llama-cpp-python`` sdist, and the model is written by :mod:`tests.infra.tiny_gguf`
with the ``gguf`` package.  Results are cached under ``~/.cache/prefixpin/`` keyed
by the llama.cpp commit (binary) and the model shape (GGUF), so CI pays the ~6 min
build once per machine and still works from an empty cache.

Usage::

    python -m tests.infra.llama            # build/locate both, print their paths
    python -m tests.infra.llama --model-only --layers 4 --embd 256
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO

SDIST_VERSION = "0.3.36"
LLAMA_COMMIT = "0c1e57098"  # the llama.cpp commit vendored by SDIST_VERSION

CACHE = Path(os.environ.get("PREFIXPIN_CACHE", Path.home() / ".cache" / "prefixpin"))


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    """Run a build step; its output goes to stderr, so that stdout holds only the paths
    this module prints (``server=$(python -c '... print(ensure_server())')`` in scripts/image)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, check=True, stdout=sys.stderr.fileno())


def cache_lock(name: str) -> IO[str]:
    """An exclusive ``flock`` on ``<cache>/.<name>.lock``, held until the returned file is
    closed (``with cache_lock(name):``): one process at a time builds what the cache
    shares (test runs may overlap)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    fh = open(CACHE / f".{name}.lock", "w")  # noqa: SIM115 - held for the build
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def server_path() -> Path:
    return CACHE / "llama" / LLAMA_COMMIT / "llama-server"


def ensure_server() -> Path:
    """Return the cached llama-server binary, building it first if missing."""
    target = server_path()
    if target.exists():
        return target
    with cache_lock("llama-build"):
        if target.exists():
            return target
        for tool in ("cmake", "ninja", "g++"):
            if shutil.which(tool) is None:
                raise SystemExit(f"building llama-server needs {tool} (apt-get install cmake ninja-build g++)")
        with tempfile.TemporaryDirectory(prefix="prefixpin-llama-") as tmp:
            work = Path(tmp)
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-binary",
                    "llama-cpp-python",
                    "--no-deps",
                    f"llama-cpp-python=={SDIST_VERSION}",
                    "-d",
                    str(work / "dl"),
                ]
            )
            sdist = next((work / "dl").glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(sdist) as tar:
                tar.extractall(work / "src", filter="data")
            src = next((work / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
            # The sdist keeps a dangling submodule .git file; ninja then loops on
            # "build.ninja still dirty", so it has to go.
            dotgit = src / ".git"
            if dotgit.is_file() or dotgit.is_symlink():
                dotgit.unlink()
            build = work / "build"
            _run(
                [
                    "cmake",
                    "-S",
                    str(src),
                    "-B",
                    str(build),
                    "-G",
                    "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=OFF",
                    "-DBUILD_SHARED_LIBS=OFF",
                    "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_UI=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=ON",
                    f"-DLLAMA_BUILD_COMMIT={LLAMA_COMMIT}",
                ]
            )
            _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)])
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp_target = target.with_suffix(".tmp")
            shutil.copy2(build / "bin" / "llama-server", tmp_target)
            tmp_target.replace(target)
        return target


def model_path(layers: int = 2, embd: int = 128) -> Path:
    return CACHE / "models" / f"tiny-l{layers}-e{embd}.gguf"


def ensure_model(layers: int = 2, embd: int = 128) -> Path:
    """Return a cached tiny random-weight GGUF of the given shape, writing it if missing."""
    target = model_path(layers, embd)
    if target.exists():
        return target
    with cache_lock("model"):
        if not target.exists():
            from tests.infra.tiny_gguf import write_model

            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            write_model(tmp, layers=layers, embd=embd)
            tmp.replace(target)
        return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--model-only", action="store_true")
    args = ap.parse_args()
    print(ensure_model(args.layers, args.embd))
    if not args.model_only:
        print(ensure_server())


if __name__ == "__main__":
    main()
