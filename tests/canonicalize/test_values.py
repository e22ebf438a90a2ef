"""Value tokens, their classes, and the shapes a rule writes for them."""

from __future__ import annotations

import re

import pytest

from canonicalize import values


def kinds(text: str) -> list[tuple[str, str]]:
    return [(k, t) for k, _, _, t in values.tokens(text) if k != "space"]


@pytest.mark.parametrize(
    ("text", "kind", "token"),
    [
        ("Current time: 14:30:15", "time", "14:30:15"),
        ("at 02:30 PM.", "time", "02:30 PM"),
        ("Conversation started: Thursday, May 14, 2026 02:30 PM", "time", "Thursday, May 14, 2026 02:30 PM"),
        ("Local time: 2026-05-14T14:30:15.123Z", "time", "2026-05-14T14:30:15.123Z"),
        ("stamp 2026-05-14 14:30:15+02:00 ok", "time", "2026-05-14 14:30:15+02:00"),
        ("Date: 2026-05-14.", "date", "2026-05-14"),
        ("Today's date: Thu Jan 01 2026", "date", "Thu Jan 01 2026"),
        ("Today is Thursday, May 14, 2026.", "date", "Thursday, May 14, 2026"),
        ("on 14 May 2026", "date", "14 May 2026"),
        ("on 14/05/2026", "date", "14/05/2026"),
        ("Request-Id: 3f2c1a9b-1234-4abc-9def-0123456789ab", "uuid", "3f2c1a9b-1234-4abc-9def-0123456789ab"),
        ("nonce a1b2c3d4e5f6 ok", "hex_id", "a1b2c3d4e5f6"),
        ("[49% — 1,085/2,200 chars]", "counter", "1,085/2,200"),
        ("MEMORY [49% — x]", "counter", "49%"),
        ("tokens used: 12,345 / 200,000", "counter", "12,345 / 200,000"),
        ("Context: ~7k/128k tokens used", "counter", "~7k/128k"),
        ("budget $3.25 left", "counter", "3.25"),
        ("uptime 1h 23m 45s", "counter", "45s"),
        ("heap 512MB of 2GiB", "counter", "2GiB"),
        ("Thu, 14 May 2026 14:30:15 GMT", "time", "Thu, 14 May 2026 14:30:15 GMT"),
    ],
)
def test_a_value_is_one_token(text: str, kind: str, token: str) -> None:
    assert (kind, token) in kinds(text)


def test_every_character_is_in_one_token() -> None:
    text = "Time 12:30:15 — ids 3f2c1a9b-1234-4abc-9def-0123456789ab, x86_64 deadbeef\nv2.0 ¿qué?"
    assert "".join(t for _, _, _, t in values.tokens(text)) == text


@pytest.mark.parametrize(
    ("text", "not_a_value"),
    [
        ("facade deadbeef", "deadbeef"),  # letters only: a word
        ("release v2 of x86_64", "x86_64"),
        ("12px wide", "12px"),
    ],
)
def test_words_are_not_values(text: str, not_a_value: str) -> None:
    assert ("word", not_a_value) in kinds(text)


@pytest.mark.parametrize(
    ("old", "new", "cls"),
    [
        ("12:30:15", "12:31:02", "time"),
        ("Thursday, May 14, 2026 11:59 PM", "Friday, May 15, 2026 12:01 AM", "time"),
        ("1778769015", "1778769090", "time"),  # epoch seconds
        ("2026-05-14", "2026-05-15", "date"),
        ("3f2c1a9b-1234-4abc-9def-0123456789ab", "8e2c1a9b-1234-4abc-9def-0123456789ac", "uuid"),
        ("a1b2c3d4e5f6", "0b1b2c3d4e5f", "hex_id"),
        ("84017732", "3f2c1a9b", "hex_id"),  # an id that happened to be all digits
        ("1,085/2,200", "1,120/2,200", "counter"),
        ("49%", "51%", "counter"),
        ("999", "1,000", "counter"),
        ("English", "French", "other"),  # an instruction word
        ("12:30:15", "2026-05-14", "other"),  # not one class on both sides
        ("1" * 70, "2" * 70, "other"),  # too long to be a value
    ],
)
def test_pair_class(old: str, new: str, cls: str) -> None:
    (ok, o), (nk, n) = kinds(old)[0], kinds(new)[0]
    assert values.pair_class(ok, o, nk, n) == cls


@pytest.mark.parametrize(
    ("cls", "old", "new", "other"),
    [
        ("time", "Thursday, May 14, 2026 02:30 PM", "Friday, May 15, 2026 12:01 AM", "Sunday, June 7, 2026 9:05 AM"),
        ("time", "2026-05-14T14:30:15.1Z", "2026-05-14T14:31:02.25Z", "2027-01-02T03:04:05.123456Z"),
        ("counter", "1,085/2,200", "1,120/2,200", "12/2,200"),
        ("uuid", "3f2c1a9b-1234-4abc-9def-0123456789ab", "8e2c1a9b-1234-4abc-9def-0123456789ac", "0" * 8 + "-" * 0),
        ("hex_id", "a1b2c3d4e5f6", "0b1b2c3d4e5f", "ffffffffffff"),
        ("date", "Thu Jan 01 2026", "Fri Jan 02 2026", "Sat Feb 28 2026"),
    ],
)
def test_shape_matches_values_of_its_kind_never_naming_them(cls: str, old: str, new: str, other: str) -> None:
    shape = values.shape(cls, old, new)
    assert re.fullmatch(shape, old) and re.fullmatch(shape, new)
    assert old not in shape and new not in shape
    if cls != "uuid":
        assert re.fullmatch(shape, other)
