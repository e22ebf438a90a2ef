"""The runs of lines that differ between two renderings of one text, found at a
bounded cost: paired, anchored on the lines each side has once, or one run."""

from __future__ import annotations

import math
import random

import pytest

from canonicalize import linediff
from canonicalize.linediff import common_prefix, common_suffix, lines


def runs(old: list[str], new: list[str]) -> list[tuple[list[str], list[str]]]:
    """The runs of ``lines`` as the lines they hold (old, new)."""
    a, b = "".join(old), "".join(new)
    return [
        (a[o1:o2].splitlines(keepends=True), b[n1:n2].splitlines(keepends=True)) for o1, o2, n1, n2, _ in lines(a, b)
    ]


def text(*rows: str) -> list[str]:
    return [f"{row}\n" for row in rows]


def test_as_many_lines_are_paired_by_position() -> None:
    old = text("You are Atlas.", "Time: 12:30:15", "Work in small steps.", "Tokens: 1,234")
    new = text("You are Atlas.", "Time: 12:31:02", "Work in small steps.", "Tokens: 1,240")
    assert runs(old, new) == [(["Time: 12:30:15\n"], ["Time: 12:31:02\n"]), (["Tokens: 1,234\n"], ["Tokens: 1,240\n"])]


def test_lines_added_are_found_between_the_lines_both_sides_have_once() -> None:
    body = [f"Rule {i}: be careful with step {i}." for i in range(40)]
    old = text("Time: 12:30:15", *body, "Tokens: 1,234")
    new = text("Time: 12:31:02", *body[:20], "## File: a.py", "print(1)", *body[20:], "Tokens: 1,240")
    assert runs(old, new) == [
        (["Time: 12:30:15\n"], ["Time: 12:31:02\n"]),
        ([], ["## File: a.py\n", "print(1)\n"]),
        (["Tokens: 1,234\n"], ["Tokens: 1,240\n"]),
    ]


def listing(n: int, other: bool) -> list[str]:
    rows = (("- item", "- other") if other else ("- item",)) * n
    return text("Top", *rows, "Bottom")


def test_lines_without_one_both_sides_have_once_are_aligned_while_pairs_last() -> None:
    # Between two anchors the lines are aligned one by one (SequenceMatcher) while the
    # comparison has pairs of lines left (MAX_ALIGNED); past them they are one run.
    many = math.isqrt(linediff.MAX_ALIGNED) + 2
    found = runs(listing(many, False), listing(many, True))
    assert [(len(o), len(n)) for o, n in found] == [(many - 1, 2 * many - 1)]
    assert runs(listing(3, False), listing(3, True)) == [([], ["- other\n"])] * 3  # under it: aligned
    # The pairs are counted across the comparison: two sections, the second past what is left.
    half = math.isqrt(linediff.MAX_ALIGNED // 2) + 1
    old = listing(half, False) + text("Middle") + listing(half, False)
    new = listing(half, True) + text("Middle") + listing(half, True)
    found, aligned = linediff.runs("".join(old), "".join(new))
    assert 0 < aligned <= linediff.MAX_ALIGNED
    assert len(found) == half + 1  # the first section aligned line by line, the second one run


def test_a_middle_past_max_lines_is_one_run_unaligned() -> None:
    def pair(n: int) -> tuple[list[str], list[str]]:
        old = text("first", *(f"line {i}" for i in range(n)), "end")
        return old, text("changed", *(f"line {i}" for i in range(n)), "added", "end")

    old, new = pair(linediff.MAX_LINES // 2)  # the middle: every line but the last, on both sides
    found = lines("".join(old), "".join(new))
    assert len(found) == 1 and found[0][4] is False
    assert runs(*pair(100)) == [(["first\n"], ["changed\n"]), ([], ["added\n"])]  # under it: aligned


def test_runs_turn_old_into_new() -> None:
    rng = random.Random(7)
    vocab = ["a\n", "b\n", "c\n", "\n", "Time: 12:30\n", "Time: 12:31\n", "x", "unique-1\n", "unique-2\n"]
    for _ in range(3000):
        old = "".join(rng.choice(vocab) for _ in range(rng.randint(0, 60)))
        new = "".join(rng.choice(vocab) for _ in range(rng.randint(0, 60)))
        rebuilt, pos = [], 0
        for o1, o2, n1, n2, replaced in lines(old, new):
            assert o1 >= pos and replaced == (o1 < o2 and n1 < n2)
            rebuilt += (old[pos:o1], new[n1:n2])
            pos = o2
        rebuilt.append(old[pos:])
        assert "".join(rebuilt) == new


@pytest.mark.parametrize("seed", [1, 2])
def test_common_prefix_and_suffix(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        a = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 9000 if rng.random() < 0.01 else 30)))
        b = a[: rng.randint(0, len(a))] + "".join(rng.choice("ab") for _ in range(rng.randint(0, 5)))
        p = common_prefix(a, b)
        assert a[:p] == b[:p] and (p == min(len(a), len(b)) or a[p] != b[p])
        s = common_suffix(a, b, min(len(a), len(b)) - p)
        assert a[len(a) - s :] == b[len(b) - s :]
        assert s == min(len(a), len(b)) - p or a[len(a) - s - 1] != b[len(b) - s - 1]
