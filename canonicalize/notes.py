"""Date notes: the system prompt keeps the lineage's first date, and the model
is still told when the agent's date moves on.

A ``date`` rule pins its span like ``pin`` does, so the system prompt (and the
whole cached prefix behind it) stays byte-stable across midnight.  When the
agent's current value differs from the pinned one, one short line saying so is
appended to the newest user message; the lineage records (history index, line)
and appends the same line to that same message in every later request, so the
forwarded history stays byte-stable too.  A line is only ever added to a message
new in this request: an already-forwarded message never changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from canonicalize.pins import Span

Note = tuple[int, str]  # (history index of a user message, the line appended to it)


def line(value: str) -> str:
    """The line that tells the model the current date."""
    return f"(Note: the current date is now {value}.)"


def new_notes(
    spans: Sequence[Span], pinned: dict[str, str], notes: Sequence[Note], *, newest_user: int | None, depth: int
) -> list[Note]:
    """Notes to add for date spans whose value moved on from the pinned one.

    ``newest_user`` is the history index of the request's newest user message and
    ``depth`` how much of the history is already recorded: a note goes only to a
    message the upstream has not seen yet (else it waits for the next one)."""
    if newest_user is None or newest_user < depth:
        return []
    said = {text for _, text in notes}
    out: list[Note] = []
    for span in spans:
        if span.rule.action != "date":
            continue
        first = pinned.get(span.key)
        if first is None or first == span.value:
            continue
        text = line(span.value)
        if text not in said:
            said.add(text)
            out.append((newest_user, text))
    return out


def appended(text: str, note: str) -> str:
    """``text`` with ``note`` as a line of its own after it."""
    return f"{text}\n\n{note}" if text else note
