"""The sample outputs README.md and docs/ show, made from the commands' real output.

A sample is the text between ``<!-- sample: NAME -->`` and ``<!-- /sample -->`` in
a Markdown file (a fenced block); NAME is one of :data:`SAMPLES`, a function that
runs the sample's commands in a scratch directory and returns the block, its
commands shown as ``$ ...`` lines with the paths a reader would use.

    ./scripts/samples            rewrite every marked block from fresh output
    ./scripts/samples --check    exit 1 naming each block that differs (tests/test_samples.py)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- sample: (?P<name>[\w-]+) -->\n(?P<body>.*?)^<!-- /sample -->$", re.M | re.S)
SHOWN = "/tmp/t"  # the scratch directory as the sample shows it


def _run(argv: list[str], cwd: Path) -> str:
    """``argv``'s stdout; the environment's PREFIXPIN_* settings left out (the
    samples show the defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXPIN_")}
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return out.stdout


def audit(work: Path) -> str:
    """README: ``prefixpin audit`` on the seeded hermes trace (its first lineages and
    the total)."""
    traces = ["python3", "-m", "benchmarks.traces", "--out", SHOWN]
    audit = ["prefixpin", "audit", f"{SHOWN}/prefix.jsonl"]
    _run([sys.executable, *traces[1:-1], str(work)], REPO)
    out = _run([sys.executable, "-m", "proxy.cli", *audit[1:-1], f"{work}/prefix.jsonl", "--no-progress"], REPO)
    lines = out.replace(str(work), SHOWN).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("lineage "))
    total = next(line for line in lines if line.startswith("total "))
    shown = [*lines[: header + 5], "...", total]  # the header, L1-L4, and the total
    comment = "      # a seeded pre-fix hermes trace (4 sessions, 8 review forks)"
    return "\n".join(["```", f"$ {' '.join(traces)}{comment}", f"$ {' '.join(audit)}", *shown, "```"]) + "\n"


SAMPLES: dict[str, Callable[[Path], str]] = {"audit": audit}


def files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def render(text: str, cache: dict[str, str]) -> str:
    """``text`` with every marked block made anew (each sample run once)."""

    def block(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in SAMPLES:
            raise KeyError(f"unknown sample {name!r} (known: {', '.join(SAMPLES)})")
        if name not in cache:
            with tempfile.TemporaryDirectory(prefix="prefixpin-sample-") as tmp:
                cache[name] = SAMPLES[name](Path(tmp))
        return f"<!-- sample: {name} -->\n{cache[name]}<!-- /sample -->"

    return MARK.sub(block, text)


def drifted() -> list[str]:
    """``file: sample`` for each marked block whose text is not what its commands print."""
    cache: dict[str, str] = {}
    out = []
    for path in files():
        text = path.read_text()
        fresh = render(text, cache)
        old = {m["name"]: m["body"] for m in MARK.finditer(text)}
        new = {m["name"]: m["body"] for m in MARK.finditer(fresh)}
        out += [f"{path.relative_to(REPO)}: {name}" for name in old if old[name] != new[name]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = ap.parse_args()
    if args.check:
        stale = drifted()
        for name in stale:
            print(f"{name}: differs from what its commands print (./scripts/samples rewrites it)", file=sys.stderr)
        return 1 if stale else 0
    cache: dict[str, str] = {}
    for path in files():
        text = path.read_text()
        fresh = render(text, cache)
        if fresh != text:
            path.write_text(fresh)
            print(f"rewrote {path.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
