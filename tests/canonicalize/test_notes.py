"""canonicalize.notes: the line that tells the model the current date (or time)."""

from __future__ import annotations

from canonicalize import notes


def test_a_date_is_told_as_the_date_and_a_clock_as_the_time() -> None:
    assert notes.line("Fri Jan 02 2026") == "(Note: the current date is now Fri Jan 02 2026.)"
    assert notes.line("14:31:02") == "(Note: the current time is now 14:31:02.)"
    assert (
        notes.line("Friday, May 15, 2026 12:01 AM") == "(Note: the current time is now Friday, May 15, 2026 12:01 AM.)"
    )
    assert notes.is_time(notes.line("14:31:02")) and not notes.is_time(notes.line("2026-05-15"))


def test_told_says_each_value_once_on_a_new_user_message() -> None:
    said = [(1, notes.line("2026-05-15"), "h1")]
    assert notes.told(["2026-05-15", "2026-05-16", "2026-05-16"], said, newest_user=3, depth=2, message="h3") == [
        (3, notes.line("2026-05-16"), "h3")
    ]
    assert notes.told(["2026-05-16"], said, newest_user=1, depth=2) == []  # already forwarded: waits
    assert notes.told(["2026-05-16"], said, newest_user=None, depth=0) == []


def test_a_note_stays_with_its_message_wherever_it_moves() -> None:
    line = notes.line("2026-05-15")
    at = {1: "a", 3: "b", 5: "c"}  # the user messages of a request: index -> hash
    assert notes.placed([(3, line, "b")], at.get, 6) == [(3, line)]  # still there
    assert notes.placed([(1, line, "c")], at.get, 6) == [(5, line)]  # moved
    assert notes.placed([(3, line, "x")], at.get, 6) == []  # gone: the note goes with it
    assert notes.placed([(3, line, "")], at.get, 6) == [(3, line)]  # a record without hashes
