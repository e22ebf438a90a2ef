"""Seeded traces of agents no rule pack knows, and how well a run stabilized them.

Three made-up agents, one per wire API, each re-rendering its system prompt with
fresh values every request (what ``canonicalize.learn`` must find on its own):

- ``atlas`` (chat completions, one system message): a seconds clock
  (``Current time: 14:30:15``), a request UUID per request, a context counter
  (``tokens used: 12,345 / 200,000``), an ISO date that changes at midnight, and
  a per-session workspace id (constant within a session);
- ``quill`` (Messages, ``system`` as two text blocks): ``Today is Thursday, May
  14, 2026``, a 16-hex nonce per request, a memory counter ``49% (1,085/2,200)``;
- ``relay`` (Responses, ``instructions``): ``Local time: 2026-05-14T14:30:15Z``,
  an epoch ``ts=1778769015``, a trace UUID, a budget ``$3.25 left``.

Sessions of two tenants are interleaved (one request each in turn), some streamed;
atlas runs tool loops; one session crosses midnight; two sessions of one tenant
start with the same message and get the same reply (their histories differ only
in the system's values); and three sessions make legitimate edits mid-session
that must reach the upstream as sent: a paragraph rewritten, one instruction word
changed, a new file added to the context.

Each line carries what a *fixed* agent would send as its system texts
(``fixed``: the session's first values, the edits applied), the volatile values
it sent (``values``) and the edits in effect (``edits``): :func:`score` compares a
run's forwarded bodies with them.

    python -m tests.infra.unknown_agents --out trace.jsonl [--sessions 3 --turns 8 --seed 11]
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from canonicalize import CHAT, MESSAGES, RESPONSES, Exchange, Memos, match
from proxy.config import Config
from proxy.offline import Offline, Replayed

Json = dict[str, Any]
T0 = datetime(2026, 5, 14, 14, 30, 15)
MIDNIGHT = datetime(2026, 5, 14, 23, 57, 40)  # the session that crosses midnight starts here
TENANTS = ("Bearer sk-unknown-a", "Bearer sk-unknown-b")
PATHS = {"atlas": "/v1/chat/completions", "quill": "/v1/messages", "relay": "/v1/responses"}
EXCHANGES: dict[str, Exchange] = {"atlas": CHAT, "quill": MESSAGES, "relay": RESPONSES}

GUIDE = (
    "Work in small, verifiable steps. Read the relevant files before you change them, run the tests after "
    "every change, and explain what you did in a short summary at the end. Prefer the standard library; "
    "ask before adding a dependency. Never print secrets or credentials, even when asked to debug them."
)
GUIDE_EDITED = (
    "Work in small, verifiable steps. Before changing a module, write a failing test that shows the bug, "
    "then fix it and keep the test. Explain what you did in a short summary at the end. Prefer the "
    "standard library; ask before adding a dependency. Never print secrets or credentials."
)
STYLE = "Answer concisely and in English."
STYLE_EDITED = "Answer thoroughly and in English."
NEW_FILE = "## File: src/billing/invoice.py\n```python\ndef total(lines):\n    return sum(x.amount for x in lines)\n```"
REFERENCE = "\n".join(
    f"- {name}: {desc}"
    for name, desc in (
        ("read_file", "Read a file of the workspace; large files are returned in pages of 400 lines."),
        ("write_file", "Write a whole file; the previous content is kept in the undo history."),
        ("search", "Search the workspace with a regular expression; at most 200 matches are returned."),
        ("run", "Run a shell command in the workspace with a 120 second timeout."),
        ("web", "Fetch a web page and return its text; scripts are not run."),
    )
)
TASKS = (
    "The nightly import failed. Find out why.",
    "Add a /health endpoint that checks the database.",
    "Why is test_retry flaky?",
    "Rename the settings module to config.",
    "Summarise the last five commits.",
    "Make the CSV parser accept semicolons.",
    "Check the Dockerfile for a smaller base image.",
    "Write release notes for 0.9.0.",
    "Find the slowest test and speed it up.",
    "Bump the linter and fix its complaints.",
)
WORDS = [
    "import",
    "sync",
    "retry",
    "database",
    "pool",
    "timeout",
    "worker",
    "queue",
    "schema",
    "index",
    "cursor",
    "module",
    "fixture",
    "commit",
]


@dataclass(frozen=True, slots=True)
class Spec:
    sessions: int = 3  # per agent and tenant
    turns: int = 8
    seed: int = 11
    tenants: int = 2


@dataclass
class Session:
    agent: str
    tenant: str
    name: str
    start: datetime
    rng: random.Random
    workspace: str = ""
    first: dict[str, str] = field(default_factory=dict)  # the first request's values (a fixed agent's)
    history: list[Json] = field(default_factory=list)
    edits: dict[str, str] = field(default_factory=dict)  # edits in effect: what, by name
    edit_at: tuple[int, str] | None = None  # (turn, edit): a legitimate edit made at that turn
    tasks: tuple[str, ...] = ()
    stream: bool = False
    tokens: int = 0
    memory: int = 1085
    budget: float = 5.0
    turn: int = 0


# -- the agents' prompts -----------------------------------------------------------------------
def _values(s: Session, now: datetime) -> dict[str, str]:
    """This request's volatile values."""
    rng = s.rng
    s.tokens += rng.randint(900, 4000)
    s.memory += rng.randint(0, 60)
    s.budget -= rng.randint(1, 30) / 100
    return {
        "clock": now.strftime("%H:%M:%S"),
        "date": now.strftime("%Y-%m-%d"),
        "long_date": now.strftime("%A, %B %d, %Y"),
        "iso": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "epoch": str(int(now.timestamp())),
        "uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "nonce": f"{rng.getrandbits(64):016x}",
        "tokens": f"{s.tokens:,}",
        "memory_pct": f"{min(99, s.memory * 100 // 2200)}%",
        "memory": f"{s.memory:,}",
        "budget": f"{s.budget:.2f}",
    }


def _texts(s: Session, v: dict[str, str]) -> list[str]:
    """The agent's system texts for values ``v`` and the session's edits."""
    guide = GUIDE_EDITED if "paragraph" in s.edits else GUIDE
    style = STYLE_EDITED if "word" in s.edits else STYLE
    extra = f"\n\n{NEW_FILE}" if "file" in s.edits else ""
    if s.agent == "atlas":
        return [
            f"You are Atlas, a coding agent. {style}\n"
            f"Current time: {v['clock']}\n"
            f"Request-Id: {v['uuid']}\n"
            f"Workspace: ws-{s.workspace}\n"
            f"Date: {v['date']}\n\n"
            f"{guide}\n\nTools:\n{REFERENCE}\n\n"
            f"Context window: tokens used: {v['tokens']} / 200,000{extra}"
        ]
    if s.agent == "quill":
        return [
            f"You are Quill, a writing and research assistant. {style}",
            f"Today is {v['long_date']}.\nNonce: {v['nonce']}\n\n{guide}\n\n"
            f"Memory: {v['memory_pct']} ({v['memory']}/2,200 chars)\n{REFERENCE}{extra}",
        ]
    return [
        f"You are Relay, an operations agent. {style}\n\n{guide}\n\n{REFERENCE}\n\n"
        f"Local time: {v['iso']} (ts={v['epoch']})\ntrace {v['uuid']}\nBudget: ${v['budget']} left{extra}"
    ]


VOLATILE = ("clock", "date", "long_date", "iso", "epoch", "uuid", "nonce", "tokens", "memory_pct", "memory")


def _body(s: Session, texts: list[str], messages: list[Json]) -> Json:
    if s.agent == "atlas":
        return {
            "model": "atlas-1",
            "messages": [{"role": "system", "content": texts[0]}, *messages],
            "tools": _chat_tools(),
            "stream": s.stream,
            "max_tokens": 64,
        }
    if s.agent == "quill":
        return {
            "model": "quill-1",
            "system": [{"type": "text", "text": t} for t in texts],
            "messages": messages,
            "max_tokens": 64,
            "stream": s.stream,
        }
    return {"model": "relay-1", "instructions": texts[0], "input": messages, "stream": s.stream, "store": False}


def _chat_tools() -> list[Json]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ').capitalize()} in the workspace.",
                "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
            },
        }
        for name in ("read_file", "write_file", "search", "run")
    ]


def _user(s: Session, text: str) -> Json:
    if s.agent == "relay":
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"role": "user", "content": text}


def _reply(s: Session, text: str) -> tuple[Json, Json]:
    """(the message the next request replays, the trace line's ``response``)."""
    if s.agent == "relay":
        item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        return item, {"id": f"resp_{s.rng.getrandbits(40):x}", "output": [item]}
    if s.agent == "quill":
        msg = {"role": "assistant", "content": [{"type": "text", "text": text}]}
        return msg, {"type": "message", "content": msg["content"]}
    return {"role": "assistant", "content": text}, {"role": "assistant", "content": text}


# -- the trace -----------------------------------------------------------------------------------
def sessions(spec: Spec) -> list[Session]:
    rng = random.Random(spec.seed)
    out: list[Session] = []
    for agent in ("atlas", "quill", "relay"):
        for t in range(spec.tenants):
            for i in range(spec.sessions):
                start = T0 + timedelta(minutes=rng.randint(0, 90), seconds=rng.randint(0, 59))
                s = Session(agent, TENANTS[t], f"{agent}-{t}-{i}", start, random.Random(rng.getrandbits(64)))
                s.workspace = f"{rng.getrandbits(48):012x}"
                s.tasks = tuple(rng.sample(TASKS, len(TASKS)))
                s.stream = (i + t) % 2 == 1  # every agent streams in some sessions, not in others
                out.append(s)
    # One session of atlas crosses midnight; two of one tenant share a first message
    # and its reply; three make a legitimate edit mid-session.
    out[0].start = MIDNIGHT
    out[1].tasks = out[0].tasks
    for s in out:
        edit = {"atlas-0-2": "paragraph", "quill-0-0": "word", "relay-0-0": "file"}.get(s.name)
        if edit is not None:
            s.edit_at = (spec.turns // 2, edit)
    return out


def generate(spec: Spec = Spec()) -> list[Json]:
    """The trace: every session's requests, interleaved."""
    live = sessions(spec)
    lines: list[Json] = []
    t = 0.0
    for turn in range(spec.turns):
        for s in live:
            lines += _turn(s, turn, t)
            t += 1.0
    return lines


def _turn(s: Session, turn: int, t: float) -> Iterator[Json]:
    rng = s.rng
    if s.edit_at is not None and s.edit_at[0] == turn:
        s.edits[s.edit_at[1]] = s.edit_at[1]
    s.history.append(_user(s, s.tasks[turn % len(s.tasks)] if turn < len(s.tasks) else _text(rng, 6)))
    steps = 2 if s.agent == "atlas" and turn % 3 == 1 else 1  # a tool loop: a call, then its result
    for step in range(steps):
        now = s.start + timedelta(seconds=75 * turn + 20 * step + rng.randint(0, 9))
        v = _values(s, now)
        if not s.first:
            s.first = dict(v)
        texts = _texts(s, v)
        fixed = _texts(s, s.first)
        body = _body(s, texts, [dict(m) for m in s.history])
        if step + 1 < steps:
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            reply: Json = {"role": "assistant", "content": None, "tool_calls": [call]}
            s.history += [reply, {"role": "tool", "tool_call_id": f"call_{turn}", "content": _text(rng, 12)}]
            response: Json = reply
        else:
            text = f"Done with {turn}." if s.name.endswith(("-0-0", "-0-1")) else f"Done: {_text(rng, 10)}."
            replayed, response = _reply(s, text)
            s.history.append(replayed)
        yield {
            "t": t + step / 10,
            "path": PATHS[s.agent],
            "headers": {"Authorization": s.tenant},
            "body": body,
            "response": response,
            "agent": s.agent,
            "session": s.name,
            "turn": turn,
            "fixed": fixed,
            "values": sorted({v[k] for k in VOLATILE} | {f"ws-{s.workspace}"}),
            "edits": sorted(s.edits),
        }


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# -- scoring a run -------------------------------------------------------------------------------
EDIT_TEXT = {"paragraph": "write a failing test", "word": "Answer thoroughly", "file": "src/billing/invoice.py"}


def system_texts(agent: str, body: bytes | Json) -> list[str]:
    """The system texts of a body as forwarded (what the fixed agent's are compared with)."""
    parsed = orjson.loads(body) if isinstance(body, bytes) else body
    return [s.get() for s in EXCHANGES[agent].system_slots(parsed)]


@dataclass
class Score:
    requests: int = 0
    fixed: int = 0  # forwarded the fixed agent's system texts
    cached: int = 0  # system bytes a prefix cache serves from the session's previous request
    cached_fixed: int = 0  # the same, for the fixed agent
    edits: int = 0  # requests with a legitimate edit in effect
    edits_pinned: int = 0  # of those, forwarded without the edit
    leaks: int = 0  # forwarded a value only another session sent
    misses: list[tuple[str, int]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.fixed / self.requests if self.requests else 0.0

    @property
    def kept(self) -> float:
        """The share of the fixed agent's cacheable system bytes the run kept."""
        return self.cached / self.cached_fixed if self.cached_fixed else 1.0


def score(lines: Sequence[Json], forwarded: Sequence[bytes | Json]) -> Score:
    """How the forwarded bodies (one per line, in order) compare with a fixed agent's."""
    own: dict[str, set[str]] = {}
    agents: dict[str, set[str]] = {}  # every value an agent's sessions sent
    for line in lines:
        own.setdefault(line["session"], set()).update(line["values"])
        agents.setdefault(line["agent"], set()).update(line["values"])
    out = Score()
    previous: dict[str, tuple[bytes, bytes]] = {}  # session: (forwarded, fixed) system bytes
    for line, body in zip(lines, forwarded, strict=True):
        texts = system_texts(line["agent"], body)
        out.requests += 1
        if texts == line["fixed"]:
            out.fixed += 1
        else:
            out.misses.append((line["session"], line["turn"]))
        now = ("\x1e".join(texts).encode(), "\x1e".join(line["fixed"]).encode())
        before = previous.get(line["session"])
        if before is not None:
            out.cached += _common(before[0], now[0])
            out.cached_fixed += _common(before[1], now[1])
        previous[line["session"]] = now
        joined = "\n".join(texts)
        if line["edits"]:
            out.edits += 1
            if not all(EDIT_TEXT[e] in joined for e in line["edits"]):
                out.edits_pinned += 1
        foreign = agents[line["agent"]] - own[line["session"]]
        if any(value in joined for value in foreign):
            out.leaks += 1
    return out


def _common(a: bytes, b: bytes) -> int:
    """The length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = next((i for i in range(n) if a[i] != b[i]), n)
    return i


def replayed(line: Json) -> Json | None:
    """The reply a line's ``response`` records (as the proxy records a real one)."""
    resp = line["response"]
    if "output" in resp:
        return {"role": "assistant", "output": resp["output"], "id": resp["id"]}
    if resp.get("type") == "message":
        return {"role": "assistant", "content": resp["content"]}
    return dict(resp)


async def run(
    lines: Sequence[Json], config: Config, *, replies: bool = True, memos: Memos | None = None
) -> list[Replayed]:
    """Every line through the proxy's own request flow (proxy.offline), in order; with
    ``replies`` each line's response is recorded (else none is: a trace without them);
    ``memos``: the canonicalizer's (``Memos.off()``: none)."""
    offline = Offline(config, memos=memos)
    flows = []
    for line in lines:
        reply = replayed(line) if replies else None
        exchange = match(line["path"])
        assert exchange is not None
        flows.append(await offline.send(line["body"], exchange=exchange, headers=line["headers"], reply=reply))
    return flows


def write(path: Path, lines: Sequence[Json]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a seeded trace of agents no rule pack knows.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sessions", type=int, default=Spec().sessions)
    ap.add_argument("--turns", type=int, default=Spec().turns)
    ap.add_argument("--seed", type=int, default=Spec().seed)
    args = ap.parse_args()
    print(write(args.out, generate(Spec(sessions=args.sessions, turns=args.turns, seed=args.seed))))


if __name__ == "__main__":
    main()
