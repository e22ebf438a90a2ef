"""A copy of ``canonicalize/`` compiled with mypyc, every module that compiles and imports.

:func:`compiled_core` copies the package into a fresh directory, runs ``mypyc --strict``
over its modules there, imports every module of the result in a subprocess and
runs the caller's check (the benchmark sends a few requests through it).  A module
mypy or mypyc rejects (an error, or an internal mypyc crash pointing at one of its
lines), or where the compiled copy fails to import or to serve a request, is left
out, with the first line that says why, and the rest is compiled again from a fresh
copy; a module left out
stays pure Python next to the compiled ones (an extension module is found before a
``.py`` of the same name).  Nothing in the repository is changed.

The result lands in ``~/.cache/prefixpin/mypyc/<hash>``, keyed by the hash of the
sources, mypy's version and the interpreter, so an edit compiles again and a rerun
does not; ``build.json`` there lists what was compiled, what was left out and why,
and how long the compile took.  The compile runs at nice 19 in a scheduling group of
its own (the machine may be shared).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.overhead.tools import CACHE, prioritize

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "canonicalize"
ROOT = CACHE / "mypyc"
MYPYC_ARGS = ("--strict",)  # the options the repository's mypy run uses for canonicalize/
SCHEME = "2"  # bump when the way of building changes, so old caches are not reused

# "canonicalize/x.py:12: error: ..." (mypy, mypyc) or "canonicalize/x.py:12: AssertionError: ..." (a mypyc crash)
_BUILD_ERROR = re.compile(r"^(canonicalize/[\w/]+\.py):\d+: (?:error: )?(.*)$", re.M)
_FRAME = re.compile(r'File "(?:[^"]*/)?(canonicalize/[\w/]+\.py)", line (\d+)')
_IMPORT_ALL = (
    "import importlib, pkgutil, canonicalize\n"
    "for m in pkgutil.walk_packages(canonicalize.__path__, 'canonicalize.'):\n"
    "    importlib.import_module(m.name)\n"
)


@dataclass(frozen=True)
class Build:
    """A compiled copy: ``path`` is the directory to put on ``sys.path``."""

    path: Path
    compiled: list[str]  # module names
    excluded: dict[str, str]  # module name -> why it stays pure Python
    compile_s: float  # wall time of every round, the failed ones included
    rounds: int
    mypy: str


def module_name(rel: str) -> str:
    """``canonicalize/wire/base.py`` -> ``canonicalize.wire.base``."""
    dotted = rel.removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


def sources() -> list[str]:
    """The package's modules, as paths relative to the repository."""
    return sorted(str(p.relative_to(REPO)) for p in SOURCE.rglob("*.py"))


def key() -> str:
    """What a compiled copy depends on: the sources, mypy and the interpreter."""
    h = hashlib.sha256()
    parts = (SCHEME, importlib.metadata.version("mypy"), sys.version, str(sysconfig.get_config_var("EXT_SUFFIX")))
    for part in parts:
        h.update(part.encode() + b"\0")
    for rel in sources():
        h.update(rel.encode() + b"\0" + (REPO / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


Check = Callable[[Path], dict[str, str]]  # a compiled copy's directory -> {module path: why it must stay pure}


def compiled_core(check: Check, log: bool = True) -> tuple[Build, bool]:
    """The compiled copy of the current sources that passes ``check``, and whether it came from the cache."""
    target = ROOT / key()
    manifest = target / "build.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        return Build(**{**data, "path": target}), True
    ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=ROOT) as tmp:
        build = _build(Path(tmp), check, log)
        manifest_text = json.dumps({**asdict(build), "path": ""}, indent=2)
        (build.path / "build.json").write_text(manifest_text)
        try:
            build.path.rename(target)
        except OSError:  # another run finished the same build first
            if not manifest.exists():
                raise
    return Build(**{**asdict(build), "path": target}), False


def _build(work: Path, check: Check, log: bool) -> Build:
    """Compile rounds until one compiles and imports, each leaving out what the last one blamed."""
    excluded: dict[str, str] = {}
    t0 = time.monotonic()
    for round_no in range(1, len(sources()) + 1):
        here = work / f"round{round_no}"
        shutil.copytree(SOURCE, here / "canonicalize", ignore=shutil.ignore_patterns("__pycache__"))
        files = [rel for rel in sources() if module_name(rel) not in excluded]
        if log:
            print(f"mypyc: round {round_no}, compiling {len(files)} modules ...", file=sys.stderr, flush=True)
        blamed = _compile(here, files) or _import_all(here) or check(here)
        if not blamed:
            for junk in ("build", ".mypy_cache"):
                shutil.rmtree(here / junk, ignore_errors=True)
            compiled = [module_name(rel) for rel in files]
            version = importlib.metadata.version("mypy")
            return Build(here, compiled, excluded, round(time.monotonic() - t0, 1), round_no, version)
        for rel, why in blamed.items():
            excluded[module_name(rel)] = why
            if log:
                print(f"mypyc: leaving out {module_name(rel)}: {why}", file=sys.stderr, flush=True)
        shutil.rmtree(here)
    raise RuntimeError("mypyc: no module left to compile")


def _compile(here: Path, files: list[str]) -> dict[str, str]:
    """Run mypyc in ``here``; {} when it built, else the modules it blamed and why."""
    argv = ["nice", "-n", "19", sys.executable, "-m", "mypyc", *MYPYC_ARGS, *files]
    proc = subprocess.Popen(argv, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    prioritize(proc.pid, 19)  # its own session: nice alone would rank it only within that session
    out = proc.communicate()[0].decode(errors="replace")
    if proc.returncode == 0:
        return {}
    blamed: dict[str, str] = {}
    for m in _BUILD_ERROR.finditer(out):
        if not m.group(2).startswith("note:"):
            blamed.setdefault(m.group(1), f"{m.group(0).split(': ', 1)[0]}: {m.group(2)}")
    if not blamed:
        raise RuntimeError(f"mypyc failed and blamed no module:\n{out[-3000:]}")
    return blamed


def _import_all(here: Path) -> dict[str, str]:
    """Import every module of the compiled copy; {} when all import, else the one that failed."""
    env = {**os.environ, "PYTHONPATH": str(here)}
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL], cwd=here, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return {}
    return blame(proc.stderr, "fails to import once compiled")


def blame(stderr: str, what: str) -> dict[str, str]:
    """The module of the core where the first traceback in ``stderr`` ended, and why."""
    for block in stderr.split("Traceback (most recent call last):")[1:]:
        frames = _FRAME.findall(block)
        if frames:
            rel, line = frames[-1]
            error = next((ln for ln in block.splitlines() if ln and not ln.startswith(" ")), "?")
            return {rel: f"{rel}:{line}: {what}: {error}"}
    raise RuntimeError(f"the compiled copy {what}, in no module of its own:\n{stderr[-3000:]}")
