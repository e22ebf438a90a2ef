"""Values an agent renders fresh into the same prompt: tokens, their classes, and
regexes that match every value of a class's shape.

:func:`tokens` cuts a text into tokens where every value is one token: a clock
time, a date, a datetime (``Thursday, May 14, 2026 02:30 PM``,
``2026-05-14T14:30:15Z``), a UUID, a hex id, a number or counter (``49%``,
``1,085/2,200``, ``~7k/128k``); everything else is words, spaces and single
characters.  A value changed between two renderings of one prompt is then one
token replaced by one token, and :func:`pair_class` says what it is:

=========  ====================================================================
``time``   clock times (seconds, AM/PM), datetimes, epoch seconds/milliseconds
``date``   ISO and written dates (``2026-05-14``, ``May 14, 2026``, ``14/05/2026``)
``uuid``   ``8-4-4-4-12`` hex
``hex_id`` 6+ hex digits of one length, digits and letters among them
``counter`` numbers, percentages, ``used/limit``, sizes and durations (``512MB``, ``1h``)
``other``  anything else: a word, an inserted or removed run, a long value
=========  ====================================================================

Both the old and the new value must be of the class (an id that became a word
is ``other``), and short (``MAX_VALUE``).  :func:`shape` writes the regex a rule
uses for a value: the value's own shape (digits as ``\\d``, month and day names
as their alternations), never the value itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

CLASSES = ("time", "date", "uuid", "hex_id", "counter", "other")
Token = tuple[str, int, int, str]  # (kind, start, end, text)
MAX_VALUE = 64  # characters: a longer changed run is content, not a value

_B = r"(?<![0-9A-Za-z])"  # a value starts and ends at a word's edge
_E = r"(?![0-9A-Za-z])"
DOW = r"(?:Mon(?:day)?|Tue(?:s(?:day)?)?|Wed(?:nesday)?|Thu(?:r(?:s(?:day)?)?)?|Fri(?:day)?|Sat(?:urday)?|Sun(?:day)?)"
MON = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_ISO_DATE = r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
_DATE = (
    rf"(?:{_ISO_DATE}"
    rf"|(?:{DOW},? )?{MON}\.? {_DAY},? \d{{4}}"  # Thursday, May 14, 2026 | Thu Jan 01 2026 | May 14, 2026
    rf"|(?:{DOW},? )?{_DAY} {MON}\.?,? \d{{4}}"  # 14 May 2026 | Thu, 14 May 2026
    r"|\d{4}/\d{1,2}/\d{1,2}|\d{1,2}/\d{1,2}/(?:\d{4}|\d{2})|\d{1,2}\.\d{1,2}\.\d{4})"
)
_ZONE = r"(?:Z|[+-](?:[01]\d|2[0-3]):?[0-5]\d| (?:UTC|GMT))?"
_TIME = rf"(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d{{1,9}})?)?(?: ?(?:[AaPp][Mm]|[AaPp]\.[Mm]\.))?{_ZONE}"
_NUM = r"~?\d+(?:[.,]\d+)*(?: ?%|[kKMB]|[KMGT]i?B|ms|min|[smhd])?"  # 49%, 7k, 512MB, 1h 23m 45s
_PATTERNS = {
    "time": rf"{_ISO_DATE}[T ]{_TIME}|{_DATE}(?:,? (?:at )?){_TIME}|{_TIME}",
    "date": _DATE,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "hex_id": r"(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{6,}",
    "counter": rf"{_NUM}(?: ?/ ?{_NUM})?",
}
# What a value starts with: a digit, a hex digit, "~", a day's or a month's initial.
_FIRST = r"[0-9A-Fa-f~MTWSJOND]"
# One scan: the value classes first (most specific first; tried only where a value may
# start: a word of other letters goes straight to "word"), then words, spaces, the rest.
_TOKEN = re.compile(
    f"(?={_FIRST})(?:"
    + "|".join(f"(?P<{name}>{_B}(?:{p}){_E})" for name, p in _PATTERNS.items())
    + r")|(?P<word>\w+)|(?P<space>\s+)|(?P<char>.)",
    re.DOTALL,
)
# The value tokens alone, in one scan of a line: what _TOKEN finds of a value class, since a
# value starts a token exactly where no word runs on into it (or at a "~", never in a word).
_VALUES = re.compile(
    f"(?:(?=~)|(?<!\\w))(?={_FIRST})(?:"
    + "|".join(f"(?P<{name}>{_B}(?:{p}){_E})" for name, p in _PATTERNS.items())
    + ")",
    re.DOTALL,
)
# A whole value of each class, for checking a rule's shape against it.
_WHOLE = {name: re.compile(f"(?:{p})") for name, p in _PATTERNS.items()}
# Every value holds a digit, but a UUID of hex letters (its "-XXXX-"): a line without either holds none.
_DIGIT = re.compile(r"\d")
_UUID_PART = re.compile(r"-[0-9a-fA-F]{4}-")
_MAYBE = (_DIGIT, _UUID_PART)
_HEX = re.compile(r"[0-9a-fA-F]+")
_EPOCH = re.compile(r"1\d{9}(?:\d{3})?")
_NAMES = re.compile(rf"{DOW}|{MON}")
# What shape() writes as a class: digit runs, day and month names, AM/PM.
_PARTS = re.compile(rf"\d+(?:[.,]\d+)*|{DOW}|{MON}|(?:[AaPp][Mm]|[AaPp]\.[Mm]\.)(?![A-Za-z])")


def escape(text: str) -> str:
    """``re.escape``, leaving spaces and hyphens as they are (a rule stays readable)."""
    return re.escape(text).replace("\\ ", " ").replace("\\-", "-")


def tokens(text: str) -> Iterator[tuple[str, int, int, str]]:
    """``(kind, start, end, token)`` over ``text``: a value class, ``word``,
    ``space`` or ``char``.  Every character is in exactly one token."""
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        yield kind, m.start(), m.end(), m.group()


def token_list(text: str) -> list[Token]:
    """:func:`tokens` as a list (built in one pass, no generator)."""
    return [(m.lastgroup or "char", m.start(), m.end(), m.group()) for m in _TOKEN.finditer(text)]


def value_tokens(text: str, start: int = 0, end: int | None = None) -> list[Token]:
    """The value tokens of ``text[start:end]`` (whole lines), as :func:`tokens` finds
    them, without tokenizing the rest: only the lines that may hold a value
    (:func:`value_lines`) are scanned, for values alone.  Offsets are ``text``'s."""
    return [
        (m.lastgroup or "", m.start(), m.end(), m.group())
        for s, e in value_lines(text, start, len(text) if end is None else end)
        for m in _VALUES.finditer(text, s, e)
    ]


def value_lines(text: str, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int]]:
    """Where each line of ``text[start:end]`` that may hold a value starts and ends (its
    newline left out), in order: a search for a digit and one for a UUID's ``-XXXX-``
    (each a fast scan), far cheaper than :func:`tokens`, which finds no value on the
    other lines."""
    stop = len(text) if end is None else end
    found = [_DIGIT.search(text, start, stop), _UUID_PART.search(text, start, stop)]
    while True:
        hits = [m for m in found if m is not None]
        if not hits:
            return
        at = min(m.start() for m in hits)
        first = text.rfind("\n", start, at) + 1 or start
        last = text.find("\n", at, stop)
        last = stop if last < 0 else last
        yield first, last
        start = last + 1
        found = [
            m if m is None or m.start() >= start else rx.search(text, start, stop)
            for m, rx in zip(found, _MAYBE, strict=True)
        ]


def is_value(kind: str) -> bool:
    return kind in _PATTERNS


def pair_class(old_kind: str, old: str, new_kind: str, new: str) -> str:
    """The class of a value that was ``old`` and is ``new`` (each with the kind
    :func:`tokens` gave it): both of one class and short, else ``other``."""
    if len(old) > MAX_VALUE or len(new) > MAX_VALUE or old == new:
        return "other"
    if "hex_id" in (old_kind, new_kind) and len(old) == len(new) and _HEX.fullmatch(old) and _HEX.fullmatch(new):
        return "hex_id"  # one side may lack letters (or digits) by chance: it is hex of the same length
    if old_kind != new_kind or not is_value(old_kind):
        return "other"
    if old_kind == "counter" and _EPOCH.fullmatch(old) and _EPOCH.fullmatch(new) and len(old) == len(new):
        return "time"
    return old_kind


def shape(cls: str, *values: str) -> str:
    """A regex for values of class ``cls`` shaped like ``values`` (it matches each of
    them whole): digits as ``\\d``, month and day names as their alternations."""
    if cls == "uuid":
        hexd = "[0-9a-f]" if all(v == v.lower() for v in values) else "[0-9a-fA-F]"
        return "-".join(f"{hexd}{{{n}}}" for n in (8, 4, 4, 4, 12))
    if cls == "hex_id":
        sizes = sorted({len(v) for v in values})
        hexd = "[0-9a-f]" if all(v == v.lower() for v in values) else "[0-9a-fA-F]"
        return f"{hexd}{{{sizes[0]}}}" if len(sizes) == 1 else f"{hexd}{{{sizes[0]},{sizes[-1]}}}"
    for candidate in (_shape(cls, values[0]), f"(?:{_PATTERNS.get(cls, escape(values[0]))})"):
        if all(re.fullmatch(candidate, v) for v in values):
            return candidate
    return "|".join(escape(v) for v in values)  # (never: every value of a class fullmatches its pattern)


def _shape(cls: str, value: str) -> str:
    """``value`` written as a regex of its shape."""
    out: list[str] = []
    pos = 0
    for m in _PARTS.finditer(value):
        out.append(escape(value[pos : m.start()]))
        part = m.group()
        if part[0].isdigit():
            out.append(_digits(cls, part))
        elif _NAMES.fullmatch(part):
            out.append(DOW if re.fullmatch(DOW, part) else MON)
        else:
            out.append(r"(?:[AaPp][Mm]|[AaPp]\.[Mm]\.)")
        pos = m.end()
    out.append(escape(value[pos:]))
    return "".join(out)


def _digits(cls: str, run: str) -> str:
    """A run of digits (and separators) as a regex: any number for a counter; for a
    time or date, its digit groups (1-2 digits may grow or shrink, fractions vary)."""
    if cls == "counter":
        return r"\d+(?:[.,]\d+)*"
    parts = re.split(r"([.,])", run)
    out = []
    for i, part in enumerate(parts):
        if part in (".", ","):
            out.append(re.escape(part))
        elif i and parts[i - 1] in (".", ","):
            out.append(r"\d+")  # a fraction of a second: its precision varies
        else:
            out.append(r"\d{1,2}" if len(part) <= 2 else rf"\d{{{len(part)}}}")
    return "".join(out)


def whole(cls: str, text: str) -> bool:
    """``text`` is one value of class ``cls``."""
    pattern = _WHOLE.get(cls)
    return pattern is not None and pattern.fullmatch(text) is not None
