"""Two renderings of one prompt compared: fresh values are value changes, edits are other."""

from __future__ import annotations

import random

import pytest

from canonicalize.linediff import common_prefix, common_suffix
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


def test_common_prefix_and_suffix() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        a = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 9000 if rng.random() < 0.01 else 30)))
        b = a[: rng.randint(0, len(a))] + "".join(rng.choice("ab") for _ in range(rng.randint(0, 5)))
        p = common_prefix(a, b)
        assert a[:p] == b[:p] and (p == min(len(a), len(b)) or a[p] != b[p])
        s = common_suffix(a, b, min(len(a), len(b)) - p)
        assert a[len(a) - s :] == b[len(b) - s :]
        assert s == min(len(a), len(b)) - p or a[len(a) - s - 1] != b[len(b) - s - 1]
