"""Seeded hermes-agent traces for the cache benchmark: *pre-fix* and its *ideal* twin.

The pre-fix trace is what a legacy hermes-agent gateway sends (before #24778 /
#25434, see ``shared/seeds`` 000, 001, 003 and ``shared/agents/volatile.json``):

- every user message gets a freshly built agent, so each turn's system prompt
  carries a new ``Conversation started:`` minute, and the MEMORY / USER PROFILE
  headers show the current usage counters (they move after the review fork
  writes to memory);
- every few turns a background *review fork* replays the whole conversation
  (including the last assistant reply) plus a review prompt, from a fresh agent:
  new minute, new ``Session ID``, a narrower ``<available_skills>`` list
  (terminal/web-gated skills such as ``- maps:`` hidden) and
  ``tools = [memory, skill_manage, skill_view, skills_list]``.  The review calls
  the memory tool once, so the fork has a second request (its tool loop).

The ideal trace has the same lines in the same order and the same messages; only
the system text and tools[] differ: one system prompt per session (first minute,
first counters, one Session ID), and forks carry their parent's exact system
bytes and tools[] (what hermes does since #25434).

What stays out on purpose: memory *content* never changes (a real rebuild after a
write shows the new entry; that is new information no proxy should hide), so the
two traces differ only by volatile noise.  Assistant messages are fixed text, not
what the upstream answered; llama.cpp caches the prompt it was sent either way.

Lines carry annotations replay shows and totals: ``kind`` (root | turn | fork),
``session``, ``turn``.

    python -m benchmarks.traces --out DIR [--sessions 4 --turns 6 --fork-every 3 --seed 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

Json = dict[str, Any]

T0 = datetime(2026, 5, 14, 14, 30, 15)  # seed 000's patched clock
MODEL = "anthropic/claude-opus-4.6"
PROVIDER = "openrouter"
SEP = "═" * 46


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """The shape of a generated trace pair."""

    sessions: int = 4
    turns: int = 6
    fork_every: int = 3  # a review fork after every N-th turn
    seed: int = 7
    max_tokens: int = 8  # the replies are discarded; keep decoding cheap
    stream: bool = True  # hermes streams
    model: str = MODEL


SMOKE = TraceSpec(sessions=1, turns=4, fork_every=3, seed=7)  # one fork, then one more turn


# -- the system prompt, built like hermes' _build_system_prompt (legacy) ---------------
IDENTITY = "You are Hermes Agent, an intelligent AI assistant created by Nous Research."
GUIDANCE = (
    "Save durable facts (preferences, environment) with the memory tool. "
    "For past conversations use session_search. Save complex approaches as skills."
)
SKILLS_HEADER = "## Skills (mandatory)\nIf a skill below matches your task, load it with skill_view(name)."
# (category, name, description, toolsets it needs beyond memory/skills)
SKILLS: tuple[tuple[str, str, str, frozenset[str]], ...] = (
    ("devops", "docker-ops", "Build, run and debug containers with docker compose.", frozenset({"terminal"})),
    ("productivity", "linear", "Linear: manage issues, projects, teams via GraphQL + curl.", frozenset()),
    ("productivity", "maps", "Geocode, POIs, routes, timezones via OpenStreetMap/OSRM.", frozenset({"web"})),
    ("productivity", "nano-pdf", "Edit PDF text/typos/titles via nano-pdf CLI (NL prompts).", frozenset()),
)
PARENT_TOOLSETS = frozenset({"memory", "skills", "terminal", "file", "web", "session_search"})
REVIEW_TOOLSETS = frozenset({"memory", "skills"})
MEMORY_ENTRIES = (
    "Main project: FastAPI service in ~/src/ledger (uv, ruff).",
    "Prefers short answers; show the diff.",
)
USER_ENTRIES = ("Sam, backend dev, Europe/Berlin.",)


@dataclass(frozen=True, slots=True)
class Counter:
    """A MEMORY / USER PROFILE usage counter: ``[49% — 1,085/2,200 chars]``."""

    used: int
    limit: int

    def __str__(self) -> str:
        return f"[{min(100, self.used * 100 // self.limit)}% — {self.used:,}/{self.limit:,} chars]"


@dataclass(frozen=True, slots=True)
class SystemView:
    """Everything that varies in one rendering of the system prompt."""

    started: datetime
    session_id: str
    memory: Counter
    user: Counter
    toolsets: frozenset[str] = PARENT_TOOLSETS
    model: str = MODEL


def skills_block(toolsets: frozenset[str]) -> str:
    lines = [SKILLS_HEADER, "<available_skills>"]
    category = None
    for cat, name, desc, needs in SKILLS:
        if not needs <= toolsets:
            continue  # hermes' _skill_should_show: gated on enabled toolsets
        if cat != category:
            lines.append(f"  {cat}:")
            category = cat
        lines.append(f"    - {name}: {desc}")
    lines.append("</available_skills>")
    return "\n".join(lines)


def memory_block(title: str, counter: Counter, entries: Iterable[str]) -> str:
    return f"{SEP}\n{title} {counter}\n{SEP}\n" + "\n§\n".join(entries)


def system_prompt(v: SystemView) -> str:
    return "\n\n".join(
        [
            IDENTITY,
            GUIDANCE,
            skills_block(v.toolsets),
            memory_block("MEMORY (your personal notes)", v.memory, MEMORY_ENTRIES),
            memory_block("USER PROFILE (who the user is)", v.user, USER_ENTRIES),
            f"Conversation started: {v.started.strftime('%A, %B %d, %Y %I:%M %p')}\n"
            f"Session ID: {v.session_id}\nModel: {v.model}\nProvider: {PROVIDER}",
        ]
    )


# -- tools[] ----------------------------------------------------------------------------
def _tool(name: str, desc: str, *props: str) -> Json:
    params = {"type": "object", "properties": {p: {"type": "string"} for p in props}}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


TOOLS: tuple[Json, ...] = (
    _tool("terminal", "Run a shell command.", "command"),
    _tool("read_file", "Read a file.", "path"),
    _tool("write_file", "Write a file.", "path", "content"),
    _tool("search_files", "Grep files.", "pattern", "path"),
    _tool("web_search", "Search the web.", "query"),
    _tool("memory", "Edit memory.", "action", "content"),
    _tool("session_search", "Search past sessions.", "query"),
    _tool("skill_manage", "Create or patch a skill.", "action", "name"),
    _tool("skill_view", "Load a skill.", "name"),
    _tool("skills_list", "List skills."),
)
REVIEW_TOOL_NAMES = ("memory", "skill_manage", "skill_view", "skills_list")


def tools_for(names: Iterable[str] | None = None) -> list[Json]:
    keep = None if names is None else set(names)
    return [copy.deepcopy(t) for t in TOOLS if keep is None or t["function"]["name"] in keep]


# -- review prompts (seed 003: run_agent.py / agent/background_review.py) ------------------
MEMORY_REVIEW_PROMPT = (
    "Review the conversation above and consider saving to memory if appropriate.\n\n"
    "Focus on:\n"
    "1. Has the user revealed things about themselves — their persona, desires, "
    "preferences, or personal details worth remembering?\n"
    "2. Has the user expressed expectations about how you should behave, their work "
    "style, or ways they want you to operate?\n\n"
    "If something stands out, save it using the memory tool. "
    "If nothing is worth saving, just say 'Nothing to save.' and stop."
)
SKILL_REVIEW_PROMPT = (  # the opening of _SKILL_REVIEW_PROMPT
    "Review the conversation above and update the skill library. Be "
    "ACTIVE — most sessions produce at least one skill update, even if "
    "small. A pass that does nothing is a missed learning opportunity, "
    "not a neutral outcome.\n\n"
    "Target shape of the library: CLASS-LEVEL skills, each with a rich "
    "SKILL.md and a `references/` directory for session-specific detail. "
    "Not a long flat list of narrow one-session-one-skill entries."
)
REVIEW_PROMPTS = (MEMORY_REVIEW_PROMPT, SKILL_REVIEW_PROMPT)


# -- conversation content -------------------------------------------------------------------
TASKS = (
    "The ledger sync job failed overnight. Can you find out why?",
    "Add a /health endpoint to the API that checks the database connection.",
    "Why is tests/test_sync.py::test_retry flaky? Look at the retry logic.",
    "Bump ruff to the latest version and fix whatever it complains about.",
    "Write a short summary of what changed in the last five commits.",
    "Find where we parse the CSV imports and make it accept semicolons.",
    "Check whether our FastAPI version has the CVE mentioned on the mailing list.",
    "Rename the settings module to config and update the imports.",
    "The docker compose stack won't start on my laptop. Help me debug it.",
    "Draft release notes for 0.9.0 from the changelog.",
)
WORDS = tuple(
    " ".join(
        (
            "ledger sync retry backoff session commit import settings config handler request response",
            "database pool timeout error warning passed failed module function class test fixture",
            "migration schema column index query cursor async await worker queue job schedule",
        )
    ).split()
)
STEP_TOOLS = (
    "terminal",
    "read_file",
    "search_files",
    "web_search",
    "write_file",
    "session_search",
    "skill_view",
)


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _tool_args(rng: random.Random, name: str) -> Json:
    path = f"src/ledger/{rng.choice(WORDS)}.py"
    return {
        "terminal": {"command": rng.choice(["pytest -x -q", "git log --oneline -5", "docker compose ps"])},
        "read_file": {"path": path},
        "search_files": {"pattern": rng.choice(WORDS), "path": "src"},
        "web_search": {"query": _text(rng, 4)},
        "write_file": {"path": path, "content": _text(rng, 12)},
        "session_search": {"query": _text(rng, 3)},
        "skill_view": {"name": rng.choice(["docker-ops", "linear", "nano-pdf"])},
    }[name]


def _tool_output(rng: random.Random, name: str) -> str:
    lines = [f"{rng.choice(WORDS)}.py:{rng.randint(1, 400)}: {_text(rng, rng.randint(6, 12))}" for _ in range(4)]
    if name == "terminal":
        return "$ exit code 0\n" + "\n".join(lines)
    return json.dumps({"success": True, "result": "\n".join(lines)}, ensure_ascii=False)


# -- the two traces ------------------------------------------------------------------------
@dataclass(slots=True)
class _Writer:
    """Appends each request to both traces: same messages, the two system/tools variants."""

    spec: TraceSpec
    pre: list[Json]
    ideal: list[Json]
    session: str

    def emit(
        self,
        kind: str,
        turn: int,
        t: float,
        messages: list[Json],
        pre: tuple[str, list[Json]],
        ideal: tuple[str, list[Json]],
    ) -> None:
        for out, (system, tools) in ((self.pre, pre), (self.ideal, ideal)):
            body: Json = {
                "model": self.spec.model,
                "messages": [{"role": "system", "content": system}, *copy.deepcopy(messages)],
                "tools": copy.deepcopy(tools),
                "stream": self.spec.stream,
                "max_tokens": self.spec.max_tokens,
            }
            out.append(
                {
                    "t": round(t, 3),
                    "kind": kind,
                    "session": self.session,
                    "turn": turn,
                    "headers": {"Authorization": "Bearer hermes-bench"},
                    "body": body,
                }
            )


def _call(call_id: str, name: str, args: Json) -> Json:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
    }


def _session(spec: TraceSpec, rng: random.Random, index: int, w: _Writer, t0: float) -> float:
    """Generate one session into ``w``; returns the trace time it ends at."""
    start = T0 + timedelta(minutes=50 * index, seconds=rng.randint(0, 59))
    session_id = f"{start:%Y%m%d_%H%M%S}_{rng.getrandbits(24):06x}"
    base = SystemView(start, session_id, Counter(1085, 2200), Counter(170, 1375))
    ideal = (system_prompt(base), tools_for())
    view = base
    history: list[Json] = []
    t = t0
    for turn in range(spec.turns):
        if turn:  # the legacy gateway builds a fresh agent per message: a new minute
            view = replace(view, started=view.started + timedelta(minutes=rng.randint(1, 3)))
        pre = (system_prompt(view), tools_for())
        history.append({"role": "user", "content": rng.choice(TASKS)})
        for step in range(rng.randint(1, 2) if turn else 1):
            w.emit("root" if turn == step == 0 else "turn", turn, t, history, pre, ideal)
            name = rng.choice(STEP_TOOLS)
            call_id = f"call_{index}_{turn}_{step}"
            history.append(_call(call_id, name, _tool_args(rng, name)))
            history.append({"role": "tool", "tool_call_id": call_id, "content": _tool_output(rng, name)})
            t += rng.uniform(2, 6)
        w.emit("turn", turn, t, history, pre, ideal)
        history.append({"role": "assistant", "content": "Done. " + _text(rng, rng.randint(15, 30)) + "."})
        t += rng.uniform(20, 60)
        if (turn + 1) % spec.fork_every == 0:
            view = _fork(spec, rng, index, turn, w, t, history, view, ideal)
            t += rng.uniform(5, 10)
    return t


def _fork(
    spec: TraceSpec,
    rng: random.Random,
    index: int,
    turn: int,
    w: _Writer,
    t: float,
    history: list[Json],
    parent: SystemView,
    ideal: tuple[str, list[Json]],
) -> SystemView:
    """A background review of ``history``; returns the parent's view after its memory write."""
    prefix, _, _ = parent.session_id.rpartition("_")
    fresh = replace(
        parent,
        started=parent.started + timedelta(minutes=1),
        session_id=f"{prefix}_{rng.getrandbits(24):06x}",
        toolsets=REVIEW_TOOLSETS,
    )
    pre = (system_prompt(fresh), tools_for(REVIEW_TOOL_NAMES))
    messages = [*history, {"role": "user", "content": REVIEW_PROMPTS[(turn // spec.fork_every) % 2]}]
    w.emit("fork", turn, t, messages, pre, ideal)
    entry = f"Sam {_text(rng, rng.randint(5, 9))}."
    call_id = f"call_{index}_{turn}_review"
    messages.append(_call(call_id, "memory", {"action": "add", "content": entry}))
    used = parent.memory.used + len(entry) + 3  # "\n§\n"
    memory = Counter(used, parent.memory.limit)
    result = {"success": True, "message": "Entry added.", "usage": str(memory)[1:-1]}
    messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)})
    w.emit("fork", turn, t + rng.uniform(2, 4), messages, pre, ideal)
    return replace(parent, memory=memory)


def generate(spec: TraceSpec = TraceSpec()) -> tuple[list[Json], list[Json]]:
    """The (pre-fix, ideal) traces: same lines in the same order, sessions one after another."""
    rng = random.Random(spec.seed)
    pre: list[Json] = []
    ideal: list[Json] = []
    t = 0.0
    for index in range(spec.sessions):
        t = _session(spec, rng, index, _Writer(spec, pre, ideal, f"s{index + 1}"), t) + 30
    return pre, ideal


def write_jsonl(path: Path, lines: Iterable[Json]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path


def work_dirs(given: Path | None, prefix: str) -> tuple[Path, Path]:
    """A benchmark's work dir (``given``, else a new temp dir) and its ``logs`` dir."""
    work = given or Path(tempfile.mkdtemp(prefix=prefix))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return work, logs


def write_pair(out_dir: Path, spec: TraceSpec = TraceSpec()) -> tuple[Path, Path]:
    """Write ``prefix.jsonl`` (pre-fix) and ``ideal.jsonl`` into ``out_dir``."""
    pre, ideal = generate(spec)
    return write_jsonl(out_dir / "prefix.jsonl", pre), write_jsonl(out_dir / "ideal.jsonl", ideal)


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a seeded pre-fix hermes trace and its ideal twin.")
    ap.add_argument("--out", type=Path, required=True, help="directory for prefix.jsonl and ideal.jsonl")
    ap.add_argument("--sessions", type=int, default=TraceSpec().sessions)
    ap.add_argument("--turns", type=int, default=TraceSpec().turns)
    ap.add_argument("--fork-every", type=int, default=TraceSpec().fork_every)
    ap.add_argument("--seed", type=int, default=TraceSpec().seed)
    args = ap.parse_args()
    spec = TraceSpec(sessions=args.sessions, turns=args.turns, fork_every=args.fork_every, seed=args.seed)
    for path in write_pair(args.out, spec):
        print(path)


if __name__ == "__main__":
    main()
