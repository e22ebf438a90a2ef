"""Two renderings of one prompt compared: fresh values are value changes, edits are other."""

from __future__ import annotations

import math
import random

import pytest

from canonicalize import textdiff
from canonicalize.textdiff import Diff, changes

OLD = (
    "You are Agent X. Answer concisely.\n"
    "Current time: 12:30:15\n"
    "Request-Id: 3f2c1a9b-1234-4abc-9def-0123456789ab\n"
    "Work in small steps and run the tests.\n"
    "Tokens: 1,234 / 200,000 used\n"
    "nonce=a1b2c3d4e5f6"
)
NEW = (
    OLD.replace("12:30:15", "12:31:02")
    .replace("3f2c1a9b-1234-4abc-9def-0123456789ab", "8e2c1a9b-1234-4abc-9def-0123456789ac")
    .replace("1,234", "1,240")
    .replace("a1b2c3d4e5f6", "0b1b2c3d4e5f")
)


def found(old: str, new: str) -> list[tuple[str, str, str]]:
    d = changes(old, new)
    return [(c.cls, old[c.ostart : c.oend], new[c.nstart : c.nend]) for c in d.changes]


def test_fresh_values_are_value_changes() -> None:
    assert found(OLD, NEW) == [
        ("time", "12:30:15", "12:31:02"),
        ("uuid", "3f2c1a9b-1234-4abc-9def-0123456789ab", "8e2c1a9b-1234-4abc-9def-0123456789ac"),
        ("counter", "1,234 / 200,000", "1,240 / 200,000"),
        ("hex_id", "a1b2c3d4e5f6", "0b1b2c3d4e5f"),
    ]
    assert changes(OLD, NEW).kept == 1.0
    assert changes(OLD, OLD) == Diff((), 1.0)


@pytest.mark.parametrize(
    ("edit", "other"),
    [
        (("Answer concisely", "Answer thoroughly"), ("concisely", "thoroughly")),  # one instruction word
        (("run the tests.", "run the tests, then lint."), ("", ", then lint")),  # a sentence edited
        (("Tokens: 1,240 / 200,000 used", "Tokens: 1,240 / 200,000 used, be brief"), None),
    ],
)
def test_an_edit_is_other_and_never_a_value(edit: tuple[str, str], other: tuple[str, str] | None) -> None:
    new = NEW.replace(*edit)
    got = found(OLD, new)
    assert all(cls != "other" or (o, n) == other or other is None for cls, o, n in got)
    assert any(cls == "other" for cls, _, _ in got)


def test_a_value_on_an_edited_line_is_part_of_the_edit() -> None:
    new = NEW.replace("Tokens: 1,240 / 200,000 used", "Tokens: 1,240 / 200,000 used, be brief")
    got = found(OLD, new)
    assert ("counter", "1,234 / 200,000", "1,240 / 200,000") not in got
    assert [c for c, _, _ in got].count("other") == 2
    assert ("time", "12:30:15", "12:31:02") in got  # the other lines keep their values


def test_lines_added_or_removed_leave_their_neighbours_values() -> None:
    added = NEW.replace("Work in small", "## File: a.py\nprint(1)\nWork in small")
    got = found(OLD, added)
    assert ("other", "", "## File: a.py\nprint(1)\n") in got
    assert [c for c, _, _ in got if c != "other"] == ["time", "uuid", "counter", "hex_id"]
    removed = NEW.replace("Work in small steps and run the tests.\n", "")
    got = found(OLD, removed)
    assert [c for c, _, _ in got if c != "other"] == ["time", "uuid", "counter", "hex_id"]
    appended = NEW + "\nappended"
    assert [c for c, _, _ in found(OLD, appended) if c != "other"] == ["time", "uuid", "counter", "hex_id"]


def test_kept_is_the_share_of_old_outside_other_changes() -> None:
    other = "Something else entirely, with 12:31:02 in it."
    assert changes(OLD, other).kept < 0.5


def test_changes_rebuild_the_new_text_and_values_alone_the_old() -> None:
    rng = random.Random(5)
    alphabet = ["a", "b", "12:30", "\n", " ", "x1", "2026-05-14", "\x1e", "3f2c1a9b", "7", "\n\n", "1,085/2,200"]
    for _ in range(5000):
        old = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        new = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        d = changes(old, new)
        rebuilt, pinned, pos, npos = [], [], 0, 0
        for c in d.changes:
            assert c.ostart >= pos and c.nstart >= npos
            rebuilt += (old[pos : c.ostart], new[c.nstart : c.nend])
            pos, npos = c.oend, c.nend
        rebuilt.append(old[pos:])
        assert "".join(rebuilt) == new
        npos = 0
        for c in d.values:
            pinned += (new[npos : c.nstart], old[c.ostart : c.oend])
            npos = c.nend
        pinned.append(new[npos:])
        if not d.others:
            assert "".join(pinned) == old


# -- bounds: what one comparison may cost -----------------------------------------------------------
def test_only_the_differing_part_of_a_long_line_is_tokenized() -> None:
    # A value in a line far longer than MAX_HUNK: tokenized from the nearest edge no
    # token spans (here a parenthesis) to the next one; the rest of the line is equal.
    words = " ".join(f"word{i}" for i in range(600))
    old = f"{words} (as of 12:30:15) {words}"
    assert len(old) > 2 * textdiff.MAX_HUNK
    d = changes(old, old.replace("12:30:15", "12:31:02"))
    assert [c.cls for c in d.changes] == ["time"] and d.spent.chars == 2 * len("as of 12:30:15")


def test_a_part_longer_than_max_hunk_is_other_whole() -> None:
    old = "Time: 12:30:15\n" + "x" * textdiff.MAX_HUNK + "\nend"
    new = old.replace("12:30:15", "12:31:02").replace("x" * textdiff.MAX_HUNK, "y" * textdiff.MAX_HUNK)
    d = changes(old, new)
    assert [c.cls for c in d.changes] == ["time", "other"]
    assert d.spent.chars == 2 * len("Time: 12:30:15\n")  # the long line: unexamined


def test_a_comparison_tokenizes_at_most_its_budget() -> None:
    # 200 lines of fresh values: the first fill the budget; past it each line is "other"
    # whole, unexamined (and the value count, not the budget, says "another prompt").
    old = "".join(f"job {i}: started 12:30:15\n" for i in range(200))
    new = old.replace("12:30:15", "12:31:02")
    d = changes(old, new)
    assert d.spent.chars <= textdiff.MAX_TOKENIZED < 2 * len(old)
    examined = d.spent.chars // (2 * len("job 0: started 12:30:15\n"))
    assert 0 < len(d.values) <= examined + 1 and len(d.others) == 200 - len(d.values)
    spent = changes(old, new, budget=textdiff.Budget(0, textdiff.MAX_ALIGNED))
    assert spent.values == () and spent.spent == textdiff.NOTHING  # nothing left: every change "other"


def test_keep_stops_tokenizing_once_the_share_is_out_of_reach() -> None:
    # Most of the old text removed: with keep=0.5 nothing is left worth tokenizing.
    rules = "".join(f"Rule {i}: always check step {i} twice before going on.\n" for i in range(60))
    jobs = "".join(f"## Job {i}\nstarted 12:30:15\n" for i in range(20))
    old, new = f"# Notes\n{rules}{jobs}", "# Notes\n" + jobs.replace("12:30:15", "12:31:02")
    full, early = changes(old, new), changes(old, new, keep=0.5)
    assert full.kept < 0.5 and len(full.values) == 20 and full.spent.chars > 0
    assert early.kept < 0.5 and early.values == () and early.spent.chars == 0
    assert changes(OLD, NEW, keep=1.0) == changes(OLD, NEW)  # only values: nothing stops


def test_a_long_edit_between_values_is_one_other_change() -> None:
    # Past MAX_ALIGNED pairs of tokens left between a part's peeled ends, the middle is
    # one "other" change; the values at the ends, on their own lines, are still values.
    words = math.isqrt(textdiff.MAX_ALIGNED)  # as many words, and spaces between: more pairs than that
    para = " ".join(f"alpha{i}" for i in range(words))
    edited = " ".join(f"beta{i}" for i in range(words))
    old = f"Time: 12:30:15\n{para}\nTokens: 5"
    new = f"Time: 12:31:02\n{edited}\nand a line more\nTokens: 6"
    got = found(old, new)
    assert [c for c, _, _ in got] == ["time", "other", "counter"]
    assert got[1] == ("other", para, f"{edited}\nand a line more")
    short = found(old.replace(para, "alpha beta"), new.replace(edited, "alpha gamma"))
    assert ("other", "beta", "gamma\nand a line more") in short  # under it: aligned token by token


def test_pairs_aligned_one_by_one_are_counted_across_a_comparison() -> None:
    # Many small edits: each part's middle is aligned token by token while the
    # comparison has pairs left; then each is one "other" change.
    old = "".join(f"k{i}: a b a b a b a b\n" for i in range(200))
    new = "".join(f"k{i}: b a b a b b a b a\n" for i in range(200))
    d = changes(old, new, budget=textdiff.Budget(10**9, textdiff.MAX_ALIGNED))
    assert 0 < d.spent.pairs <= textdiff.MAX_ALIGNED
    per_line = [sum(1 for c in d.others if old.rfind("\n", 0, c.ostart) + 1 == start) for start in _starts(old)]
    assert per_line[0] > 1 and per_line[-1] == 1  # aligned first, one change past the budget


def _starts(text: str) -> list[int]:
    return [0] + [i + 1 for i, ch in enumerate(text[:-1]) if ch == "\n"]
