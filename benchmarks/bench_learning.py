"""What learning's comparison costs at worst: texts crafted to hit each of its bounds.

A request whose system text is not what its lineage forwarded is compared with it
(``canonicalize.textdiff.changes`` with a request's whole budget and
``keep=learn.MIN_KEPT``, as ``canonicalize.learn`` does).  Each case below is built
to make one step do as much work as its bound allows; the figure is the CPU time of
one comparison (this thread's, median of ``--repeat`` runs).

    python3 -m benchmarks.bench_learning [--repeat 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from canonicalize import learn, textdiff

Case = tuple[str, str]


def _another_prompt() -> Case:
    """Two unrelated 200 KB prompts (an agent's side request, grown huge)."""
    rng = random.Random(1)
    return tuple("".join(rng.choice("abc \n0123456789") for _ in range(200_000)) for _ in range(2))  # type: ignore[return-value]


def _every_line_a_value() -> Case:
    """20,000 lines, each with a fresh time: more than 64 lines differ, past 4,096 lines."""
    old = "".join(f"line {i} at 12:30:15 with some words around it\n" for i in range(20_000))
    return old, old.replace("12:30:15", "12:31:02")


def _segments() -> Case:
    """Unique lines, and between each two short runs of two repeated lines (line pairs)."""
    rng = random.Random(2)
    old: list[str] = []
    new: list[str] = []
    for k in range(62):
        old += [f"anchor {k}\n", *(rng.choice(("a\n", "b\n")) for _ in range(32))]
        new += [f"anchor {k}\n", *(rng.choice(("a\n", "b\n")) for _ in range(31))]
    return "".join(old), "".join(new)


def _one_char_tokens() -> Case:
    """100 lines of one-character tokens, each line edited (characters and token pairs)."""
    rng = random.Random(3)

    def text() -> str:
        return "".join(f"k{i}: " + " ".join(rng.choice("ab") for _ in range(31)) + "\n" for i in range(100))

    return text(), text()


def _one_long_line() -> Case:
    """A 100 KB line of short tokens, different throughout."""
    rng = random.Random(4)
    return tuple(" ".join(rng.choice(("x", "y", "1", "2")) for _ in range(50_000)) for _ in range(2))  # type: ignore[return-value]


CASES: dict[str, Callable[[], Case]] = {
    "another prompt, 200 KB": _another_prompt,
    "20,000 lines of values": _every_line_a_value,
    "62 runs between unique lines": _segments,
    "one-character tokens": _one_char_tokens,
    "a 100 KB line": _one_long_line,
}


def spent(old: str, new: str, repeat: int) -> float:
    """Median CPU milliseconds of one comparison."""
    runs = []
    for _ in range(repeat):
        t0 = time.thread_time()
        textdiff.changes(old, new, keep=learn.MIN_KEPT)
        runs.append(time.thread_time() - t0)
    return round(1e3 * statistics.median(runs), 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    figures = {name: spent(*make(), args.repeat) for name, make in CASES.items()}
    if args.json:
        print(json.dumps({"repeat": args.repeat, "ms": figures}, indent=2))
        return 0
    print(f"CPU time per comparison, median of {args.repeat} runs\n")
    print("| case | ms |\n|---|---:|")
    for name, ms in figures.items():
        print(f"| {name} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
