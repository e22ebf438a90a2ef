"""What the load generator sends: a file of body templates per workload.

Two workloads, both hermes-agent chat completions requests (non-streamed):

    body   one repeated ~45 KB body: the 4 sessions of ``body.templates``, each
           request with its own sequence number in the last user message and a
           ``Conversation started:`` minute that moves every 7 requests, so every
           request continues a lineage with a new last message (and is re-pinned)
    mix    many conversations at once, each request the next turn of one
           (:mod:`benchmarks.overhead.mix`)

A workload is a file, one template per line, that ``wrk.lua`` reads; request *n*
sends template *n* mod the count with its placeholders filled.  :func:`render` is
the same function in Python (the role check sends exactly what wrk sends).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks.overhead import body, mix

_PLACEHOLDER = re.compile(r"@@(SEQ|MM|GEN)@@")


@dataclass(frozen=True)
class Workload:
    """One workload's templates and the file wrk reads them from."""

    name: str
    path: Path
    templates: tuple[str, ...]
    about: str  # one line for the report

    @property
    def sizes(self) -> tuple[int, int, int]:
        """(smallest, mean, largest) rendered body size in bytes (placeholders ~ values)."""
        sizes = [len(t.encode()) for t in self.templates]
        return min(sizes), sum(sizes) // len(sizes), max(sizes)

    def render(self, n: int) -> str:
        return render(self.templates, n)


def render(templates: tuple[str, ...] | list[str], n: int) -> str:
    """Request ``n``'s body: as ``wrk.lua``'s ``request()`` builds it."""
    count = len(templates)

    def fill(m: re.Match[str]) -> str:
        kind = m.group(1)
        if kind == "SEQ":
            return str(n)
        if kind == "MM":
            return f"{(n // 7) % 60:02d}"
        return f"{n // count:08d}"

    return _PLACEHOLDER.sub(fill, templates[n % count])


def _write(work: Path, name: str, templates: list[str], about: str) -> Workload:
    path = work / f"{name}.jsonl"
    # Compact JSON has no raw newline (json.dumps escapes them), so a line is a body.
    assert all("\n" not in t for t in templates)
    path.write_text("\n".join(templates) + "\n", encoding="utf-8")
    return Workload(name, path, tuple(templates), about)


def repeated(work: Path, sessions: int | None = None) -> Workload:
    """``sessions``: the first so many of the load generator's sessions (default all)."""
    templates = body.templates(stream=False)[:sessions]
    about = f"one repeated hermes body ({len(templates)} sessions, a new last user message per request)"
    return _write(work, "body", templates, about)


MIX_CONVERSATIONS = 64  # the mix's conversations in flight, and the turns each takes before new ones start
MIX_TURNS = 8


def named(work: Path, name: str) -> Workload:
    """``body`` or ``mix`` at the sizes ``bench_overhead`` measures by default."""
    return repeated(work) if name == "body" else conversations(work, MIX_CONVERSATIONS, MIX_TURNS)


def conversations(work: Path, conversations: int, turns: int) -> Workload:
    about = (
        f"conversation mix ({conversations} conversations round robin, {turns} turns each, "
        "then new ones; each request continues its conversation)"
    )
    return _write(work, "mix", mix.templates(conversations, turns), about)


__all__ = ["MIX_CONVERSATIONS", "MIX_TURNS", "Workload", "conversations", "named", "render", "repeated"]
