"""Date notes: the system prompt keeps the lineage's first date, and the model
is still told when the agent's date moves on (a learned time or date too:
:mod:`canonicalize.learn`).

A ``date`` rule pins its span like ``pin`` does, so the system prompt (and the
whole cached prefix behind it) stays byte-stable across midnight.  When the
agent's current value differs from the pinned one, one short line saying so is
appended to the newest user message; the lineage records (history index, line,
the message's hash as the agent sent it) and appends the same line to that same
message in every later request, wherever the agent put it (an agent that lays
its history out anew moves it; a message it no longer sends takes its note with
it), so the forwarded history stays byte-stable too.  The line says the value
the agent sent in the request it was added to.  A line is only ever added to a
message new in this request: an already-forwarded message never changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from canonicalize.pins import Span

# (history index of a user message, the line appended to it, the hash of that message
# as the agent sent it: where the line goes in later requests; "": at that index)
Note = tuple[int, str, str]
_CLOCK = re.compile(r"\d:[0-5]\d")


def line(value: str) -> str:
    """The line that tells the model the current date (or time: a value with a clock)."""
    what = "time" if _CLOCK.search(value) else "date"
    return f"(Note: the current {what} is now {value}.)"


def is_time(note: str) -> bool:
    """``note`` (a :func:`line`) tells a time, not a date."""
    return note.startswith("(Note: the current time ")


def moved(spans: Sequence[Span], pinned: dict[str, str]) -> list[str]:
    """The values of the date spans that moved on from the pinned one: each a note to
    tell (:func:`told`)."""
    return [
        span.value for span in spans if span.rule.action == "date" and pinned.get(span.key) not in (None, span.value)
    ]


def told(
    values: Sequence[str], notes: Sequence[Note], *, newest_user: int | None, depth: int, message: str = ""
) -> list[Note]:
    """Notes that tell the model each of ``values`` (current dates or times) it was not
    told yet, on the newest user message (whose hash is ``message``) when it is new in
    this request."""
    if newest_user is None or newest_user < depth:
        return []
    said = {note[1] for note in notes}
    out: list[Note] = []
    for value in values:
        text = line(value)
        if text not in said:
            said.add(text)
            out.append((newest_user, text, message))
    return out


def placed(notes: Sequence[Note], hashes: Callable[[int], str | None], n: int) -> list[tuple[int, str]]:
    """Where each of ``notes`` goes in a request of ``n`` history items: (index, line).
    ``hashes(i)`` is the hash of item ``i`` as the agent sent it (None: not a user
    message).  A note stays on its message: at its index when the message is still
    there, else at the nearest index holding it; a note whose message is gone goes
    nowhere.  A note without a hash (recorded before notes kept one) stays at its index."""
    out: list[tuple[int, str]] = []
    for index, text, message in notes:
        if not message:
            out.append((index, text))
            continue
        if 0 <= index < n and hashes(index) == message:
            out.append((index, text))
            continue
        near = sorted(range(n), key=lambda i: (abs(i - index), i))
        found = next((i for i in near if hashes(i) == message), None)
        if found is not None:
            out.append((found, text))
    return out


def appended(text: str, note: str) -> str:
    """``text`` with ``note`` as a line of its own after it."""
    return f"{text}\n\n{note}" if text else note
