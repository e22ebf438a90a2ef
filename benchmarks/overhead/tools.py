"""The benchmark's native tools: Go binaries built once per source, and Debian packages.

Binaries land in ``~/.cache/prefixpin/bench/<name>-<hash>``, keyed by the hash of
their source and the Go version, so an edit rebuilds and a rerun does not.  The Go
build cache and GOPATH live under ``~/.cache/prefixpin`` too; only the standard
library is used, so no module is ever downloaded (``GOPROXY=off``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("PREFIXPIN_CACHE", Path.home() / ".cache" / "prefixpin"))
BIN_DIR = CACHE / "bench"


class Unavailable(RuntimeError):
    """A tool or target that cannot be had on this machine; the message says why."""


def ensure_deb(binary: str, package: str, *, candidates: tuple[str, ...] = ()) -> str:
    """The path of ``binary``, installing Debian ``package`` first if it is missing and we are root."""
    found = _which(binary, candidates)
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise Unavailable(f"{binary} is not installed (apt-get install {package})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "--no-install-recommends", package]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run([apt, "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"apt-get install {package} failed: {done.stderr.strip()[-300:]}")
    found = _which(binary, candidates)
    if not found:
        raise Unavailable(f"{binary} still missing after apt-get install {package}")
    return found


def prioritize(pid: int, nice: int | None) -> None:
    """Give process ``pid``'s session the scheduling weight of ``nice`` (None: leave it).

    Linux groups the processes of one session for scheduling (autogroups), and every
    benchmark process runs in a session of its own, so a process's own nice value only
    ranks it within its session; the session's weight is set through
    ``/proc/<pid>/autogroup``.  On a machine shared with other jobs a negative value
    gives the benchmark's processes most of the CPU they ask for, as on a machine of
    their own.  Lowering it needs root; without autogroups the process is reniced.
    """
    if nice is None:
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except FileNotFoundError:
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def _which(binary: str, candidates: tuple[str, ...]) -> str | None:
    return shutil.which(binary) or next((c for c in candidates if Path(c).exists()), None)


def go_env() -> dict[str, str]:
    return {
        **os.environ,
        "GOCACHE": str(CACHE / "go-build"),
        "GOPATH": str(CACHE / "go"),
        "GOPROXY": "off",
        "GOFLAGS": "-mod=mod",
        "GOTOOLCHAIN": "local",
        "GOTELEMETRY": "off",
        "CGO_ENABLED": "0",
        "GO111MODULE": "on",
    }


def go_binary(name: str) -> Path:
    """Build (or reuse) the Go command in ``overhead/<name>/main.go``."""
    go = ensure_deb("go", "golang-go", candidates=("/usr/lib/go/bin/go",))
    src = HERE / name / "main.go"
    env = go_env()
    version = subprocess.run([go, "version"], capture_output=True, text=True, env=env, check=True).stdout
    digest = hashlib.sha256(src.read_bytes() + version.encode()).hexdigest()[:16]
    out = BIN_DIR / f"{name}-{digest}"
    if out.exists():
        return out
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # another run may build it too: the last rename wins
    done = subprocess.run(
        [go, "build", "-trimpath", "-o", str(tmp), str(src)], capture_output=True, text=True, env=env, cwd=src.parent
    )
    if done.returncode != 0:
        raise RuntimeError(f"go build {src} failed:\n{done.stderr}")
    tmp.replace(out)
    return out


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
