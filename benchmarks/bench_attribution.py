"""How well ``prefixpin audit`` names the cause of a prefix break.

A seeded generator writes append-only agent conversations (several sessions, each
with its own system prompt, tools and params; turns of a user message, tool
calls and their results, and a reply; some lines carry the upstream's reply
under ``response``, some do not) and injects exactly one change into some
requests, one of each cause in turn:

- ``system_changed``: a sentence of the system prompt added, removed or edited;
- ``tools_changed``: a tool added, a tool's description or its schema edited;
- ``params_changed``: ``reasoning_effort``, ``chat_template_kwargs`` or
  ``tool_choice`` changed;
- ``model_changed``: another model;
- ``history_rewritten``: an earlier message the previous request sent (not the
  first: a rewritten first message shares no recorded history, so the request
  is a new conversation) edited, truncated or dropped.

Every other request extends its predecessor byte for byte.  A change persists:
the next request is append-only again against the changed one.  Each line is
annotated ``"inject": <cause>`` (or null); audit ignores the annotation.

The trace goes through ``prefixpin audit --json`` (offline, the default config:
packs ``generic`` and ``hermes``), and each request's ``cause_before`` (as sent)
and ``cause`` (after canonicalization: none of the injected changes is one
prefixpin repairs) is checked against the annotation: an injected change is
*named* (the right cause), *misnamed* (another cause) or *missed* (none); an
append-only request with a cause is a *false cause*.  The first request of each
session has no parent and is not counted.

    python -m benchmarks.bench_attribution [--sessions 60 --turns 10 --rate 0.3 --seed 11] [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

Json = dict[str, Any]
CAUSES = ("system_changed", "tools_changed", "params_changed", "model_changed", "history_rewritten")
MODELS = ("qwen3-coder-30b", "gpt-oss-120b", "glm-4.6", "deepseek-v3.2", "kimi-k2")
AGENTS = ("Atlas", "Juniper", "Kestrel", "Marlow", "Quill", "Rook", "Sable", "Tamsin")
_VOCABULARY = (
    "ledger sync retry backoff session commit import settings config handler request response database "
    "pool timeout error warning passed failed module function class test fixture migration schema column "
    "index query cursor async await worker queue job schedule parser token buffer stream socket cache"
)
WORDS = tuple(_VOCABULARY.split())
GUIDANCE = (
    "Read the relevant files before you change anything.",
    "Prefer small, reviewable diffs and explain each one in a sentence.",
    "Run the test suite after every change and report failures verbatim.",
    "Never commit secrets; redact tokens and passwords in tool output.",
    "Ask before deleting files or rewriting history.",
    "Keep answers short; show commands and their output rather than describing them.",
    "When a tool fails, read its error and try a different approach before giving up.",
    "Use the project's formatter and linter; do not reformat unrelated code.",
    "Write tests for every bug you fix, named after the behaviour they check.",
    "Summarise what you did at the end of each task in three bullet points at most.",
    "Respect the repository's conventions for naming, layout and imports.",
    "If a request is ambiguous, state the assumption you make and go on.",
)
TOOL_POOL: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("shell", "Run a shell command in the workspace and return its output.", ("command", "timeout")),
    ("read_file", "Read a file from the workspace.", ("path", "offset", "limit")),
    ("write_file", "Create or overwrite a file.", ("path", "content")),
    ("edit_file", "Replace an exact string in a file.", ("path", "old", "new")),
    ("grep", "Search file contents with a regular expression.", ("pattern", "path")),
    ("glob", "List files matching a glob pattern.", ("pattern",)),
    ("web_fetch", "Fetch a URL and return its text.", ("url",)),
    ("todo", "Update the task list.", ("items",)),
    ("memory", "Save a durable note.", ("content",)),
    ("ask_user", "Ask the user a question.", ("question",)),
)
EXTRA_TOOLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("browser", "Open a page in a headless browser and return a snapshot.", ("url", "action")),
    ("python", "Run a Python snippet in a sandbox.", ("code",)),
    ("notebook", "Edit a Jupyter notebook cell.", ("path", "cell", "source")),
)


def _tool(name: str, desc: str, props: tuple[str, ...]) -> Json:
    params = {"type": "object", "properties": {p: {"type": "string"} for p in props}, "required": list(props[:1])}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


@dataclass(frozen=True, slots=True)
class Spec:
    sessions: int = 60
    turns: int = 10
    rate: float = 0.3  # share of requests (after a session's first) that get an injected change
    seed: int = 11
    api: str = "chat"  # chat | messages (the same conversations in Anthropic's shape)


SMOKE = Spec(sessions=12, turns=6, rate=0.35, seed=5)


@dataclass
class Session:
    """One conversation's state: what its next request sends."""

    index: int
    rng: random.Random
    agent: str
    system: list[str]  # sentences
    tools: list[Json]
    params: Json
    model: str
    replies: bool  # the trace records the upstream's replies (``response``)
    history: list[Json] = field(default_factory=list)
    sent: int = 0  # history messages the previous request sent

    def body(self) -> Json:
        system = f"You are {self.agent}, a coding agent working in the user's repository.\n\n" + "\n".join(self.system)
        return {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, *copy.deepcopy(self.history)],
            "tools": copy.deepcopy(self.tools),
            "max_tokens": 256,
            "temperature": 0.2,
            **copy.deepcopy(self.params),
        }


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _session(index: int, rng: random.Random) -> Session:
    tools = [_tool(*t) for t in rng.sample(TOOL_POOL, rng.randint(4, len(TOOL_POOL)))]
    system = rng.sample(GUIDANCE, rng.randint(6, len(GUIDANCE)))
    system += [f"Project notes: {_text(rng, 40)}." for _ in range(rng.randint(2, 8))]  # a 1-4 KB prompt
    params: Json = {"reasoning_effort": rng.choice(["low", "medium"])}
    if rng.random() < 0.5:
        params["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    agent = f"{rng.choice(AGENTS)}-{index}"
    return Session(index, rng, agent, system, tools, params, rng.choice(MODELS), replies=rng.random() < 0.5)


# -- the injected changes: each edits the session's state before its next request ------------
def _inject_system(s: Session) -> None:
    rng, i = s.rng, s.rng.randrange(len(s.system))
    kind = rng.choice(["add", "remove", "edit"]) if len(s.system) > 1 else "add"
    if kind == "add":
        s.system.insert(i, f"New rule: {_text(rng, 12)}.")
    elif kind == "remove":
        del s.system[i]
    else:
        s.system[i] = s.system[i].rstrip(".") + f", {_text(rng, 3)}."


def _inject_tools(s: Session) -> None:
    rng = s.rng
    kind = rng.choice(["add", "description", "schema"])
    if kind == "add":
        names = {t["function"]["name"] for t in s.tools}
        extra = [t for t in EXTRA_TOOLS if t[0] not in names] or [(f"tool_{rng.getrandbits(16):x}", "A tool.", ("x",))]
        s.tools.insert(rng.randint(0, len(s.tools)), _tool(*rng.choice(extra)))
    elif kind == "description":
        fn = rng.choice(s.tools)["function"]
        fn["description"] += f" {_text(rng, 4).capitalize()}."
    else:
        props = rng.choice(s.tools)["function"]["parameters"]["properties"]
        props[f"opt_{rng.choice(WORDS)}_{rng.getrandbits(8)}"] = {"type": "boolean"}


def _inject_params(s: Session) -> None:
    rng = s.rng
    kind = rng.choice(["reasoning_effort", "chat_template_kwargs", "tool_choice"])
    if kind == "reasoning_effort":
        s.params["reasoning_effort"] = {"low": "high", "medium": "high", "high": "low"}[s.params["reasoning_effort"]]
    elif kind == "chat_template_kwargs":
        old = s.params.get("chat_template_kwargs", {}).get("enable_thinking", False)
        s.params["chat_template_kwargs"] = {"enable_thinking": not old}
    else:
        s.params["tool_choice"] = "required" if s.params.get("tool_choice") != "required" else "auto"


def _inject_model(s: Session) -> None:
    s.model = s.rng.choice([m for m in MODELS if m != s.model])


def _inject_history(s: Session) -> None:
    """Edit a message the previous request sent, other than the first."""
    rng = s.rng
    i = rng.randrange(1, s.sent)
    msg = s.history[i]
    if msg["role"] == "tool":
        kind = rng.choice(["truncate", "drop"])
        if kind == "drop" and i >= 1 and s.history[i - 1].get("tool_calls"):
            del s.history[i - 1 : i + 1]  # a call and its result, as context trimmers drop them
            return
        msg["content"] = msg["content"][: max(len(msg["content"]) // 3, 1)] + " [truncated]"
    elif msg.get("tool_calls"):
        msg["content"] = f"Let me look: {_text(rng, 5)}."
    else:
        msg["content"] = (msg.get("content") or "") + f" ({_text(rng, 3)})"


INJECT = {
    "system_changed": _inject_system,
    "tools_changed": _inject_tools,
    "params_changed": _inject_params,
    "model_changed": _inject_model,
    "history_rewritten": _inject_history,
}


# -- the trace -----------------------------------------------------------------------------
def _call(s: Session, turn: int, step: int) -> Json:
    tool = s.rng.choice(s.tools)["function"]
    args = {p: _text(s.rng, 2) for p in list(tool["parameters"]["properties"])[:2]}
    function: Json = {"name": tool["name"], "arguments": json.dumps(args)}
    call: Json = {"id": f"call_{s.index}_{turn}_{step}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def generate(spec: Spec = Spec()) -> list[Json]:
    """The trace's lines, sessions interleaved, changes injected (module docstring)."""
    rng = random.Random(spec.seed)
    sessions = [_session(i, random.Random(rng.getrandbits(64))) for i in range(spec.sessions)]
    plans = {s.index: _plan(s, spec) for s in sessions}
    order = [s.index for s in sessions for _ in plans[s.index]]
    rng.shuffle(order)  # interleave the sessions, each in its own order
    cursor = dict.fromkeys(plans, 0)
    lines: list[Json] = []
    causes = iter(CAUSES * (spec.sessions * spec.turns))
    for t, i in enumerate(order):
        s, (turn, step, reply) = sessions[i], plans[i][cursor[i]]
        cursor[i] += 1
        inject = None
        if s.sent and rng.random() < spec.rate:
            inject = next(causes)
            if inject == "history_rewritten" and s.sent < 2:
                inject = None
            else:
                INJECT[inject](s)
        if step == 0:
            s.history.append({"role": "user", "content": f"Task {turn + 1} for {s.agent}: {_text(s.rng, 14)}?"})
        line: Json = {"t": t, "headers": {"Authorization": "Bearer bench"}, "body": s.body(), "inject": inject}
        s.sent = len(s.history)
        answer: Json = _call(s, turn, step) if not reply else {"role": "assistant", "content": _text(s.rng, 25) + "."}
        if s.replies:
            line["response"] = copy.deepcopy(answer)  # a later rewrite edits the history, not this reply
        s.history.append(answer)
        if not reply:
            s.history.append({"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": _output(s)})
        lines.append(line)
    return [to_messages(line) for line in lines] if spec.api == "messages" else lines


def _plan(s: Session, spec: Spec) -> list[tuple[int, int, bool]]:
    """(turn, step, the answer is the turn's reply) for each request of the session."""
    out = []
    for turn in range(spec.turns):
        steps = s.rng.randint(0, 2)
        out += [(turn, step, step == steps) for step in range(steps + 1)]
    return out


def _output(s: Session) -> str:
    return "\n".join(f"{s.rng.choice(WORDS)}.py:{s.rng.randint(1, 400)}: {_text(s.rng, 8)}" for _ in range(4))


# -- the same conversations on /v1/messages ---------------------------------------------------
EFFORT = {"low": 1024, "medium": 4096, "high": 16384}


def to_messages(line: Json) -> Json:
    """A chat-completions line as the same request in Anthropic's shape: top-level
    ``system``, tools with ``input_schema``, calls as ``tool_use`` blocks and results
    as ``tool_result`` blocks, ``reasoning_effort`` as a thinking budget."""
    body = line["body"]
    out: list[Json] = []
    for m in body["messages"][1:]:
        out.append(_message(m))
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in body["tools"]
    ]
    new: Json = {"model": body["model"], "max_tokens": 256, "system": body["messages"][0]["content"], "tools": tools}
    new["messages"] = out
    new["thinking"] = {"type": "enabled", "budget_tokens": EFFORT[body["reasoning_effort"]]}
    if "tool_choice" in body:
        new["tool_choice"] = {"type": "any" if body["tool_choice"] == "required" else "auto"}
    if "chat_template_kwargs" in body:
        new["chat_template_kwargs"] = body["chat_template_kwargs"]
    converted = {**line, "path": "/v1/messages", "body": new}
    if "response" in line:
        converted["response"] = {
            "type": "message",
            "role": "assistant",
            "content": _message(line["response"])["content"],
        }
    return converted


def _message(m: Json) -> Json:
    if m["role"] == "tool":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}],
        }
    if m["role"] == "assistant" and m.get("tool_calls"):
        blocks: list[Json] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
        for c in m["tool_calls"]:
            f = c["function"]
            blocks.append({"type": "tool_use", "id": c["id"], "name": f["name"], "input": json.loads(f["arguments"])})
        return {"role": "assistant", "content": blocks}
    return {"role": m["role"], "content": m["content"]}


# -- scoring -------------------------------------------------------------------------------
def score(lines: list[Json], report: Json) -> Json:
    """Injected changes named / misnamed / missed, and false causes on append-only requests,
    as sent (``cause_before``) and after canonicalization (``cause``)."""
    by_index = {r["index"]: r for r in report["requests"]}
    out: Json = {}
    for view, key in (("as_sent", "cause_before"), ("after", "cause")):
        tally: Counter[str] = Counter()
        per_cause: dict[str, Counter[str]] = {c: Counter() for c in CAUSES}
        wrong: list[Json] = []
        for i, line in enumerate(lines):
            r = by_index[i]
            got, want = r[key], line["inject"]
            if r["parent"] is None and want is None and got is None:
                continue  # a session's first request: nothing to compare with
            if want is None:
                tally["append_only"] += 1
                if got is not None:
                    tally["false"] += 1
                    wrong.append({"index": i, "want": None, "got": got})
                continue
            verdict = "named" if got == want else ("missed" if got is None else "misnamed")
            tally["injected"] += 1
            tally[verdict] += 1
            per_cause[want][verdict] += 1
            if verdict != "named":
                wrong.append({"index": i, "want": want, "got": got})
        out[view] = {
            "injected": tally["injected"],
            "named": tally["named"],
            "misnamed": tally["misnamed"],
            "missed": tally["missed"],
            "append_only": tally["append_only"],
            "false_causes": tally["false"],
            "by_cause": {c: dict(v) for c, v in per_cause.items()},
            "wrong": wrong[:20],
        }
    return out


def audit(trace: Path) -> Json:
    argv = [sys.executable, "-m", "proxy.cli", "audit", str(trace), "--json", "--no-progress"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=True)
    report: Json = json.loads(out.stdout)
    return report


def run(spec: Spec, keep: Path | None = None) -> Json:
    lines = generate(spec)
    work = keep or Path(tempfile.mkdtemp(prefix="prefixpin-attribution-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "attribution.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = score(lines, audit(trace))
    result["spec"] = {"sessions": spec.sessions, "turns": spec.turns, "rate": spec.rate, "seed": spec.seed}
    result["spec"]["api"] = spec.api
    result["requests"] = len(lines)
    result["trace"] = str(trace)
    return result


def table(result: Json) -> str:
    rows = [
        f"{result['requests']} {result['spec']['api']} requests, {result['spec']['sessions']} sessions "
        f"(seed {result['spec']['seed']}); "
        f"trace: {result['trace']}",
        "",
        f"{'view':<22} {'injected':>8} {'named':>6} {'misnamed':>8} {'missed':>6} {'append-only':>11} {'false':>6}",
    ]
    for view, name in (("as_sent", "as sent"), ("after", "after canonicalization")):
        v = result[view]
        rows.append(
            f"{name:<22} {v['injected']:>8} {v['named']:>6} {v['misnamed']:>8} {v['missed']:>6} "
            f"{v['append_only']:>11} {v['false_causes']:>6}"
        )
    rows += ["", "named / injected, by cause (as sent):"]
    for cause, v in result["as_sent"]["by_cause"].items():
        rows.append(f"  {cause:<18} {v.get('named', 0):>4} / {sum(v.values()):<4}")
    for view in ("as_sent", "after"):
        for w in result[view]["wrong"]:
            rows.append(f"  {view}: line {w['index'] + 1}: injected {w['want']}, named {w['got']}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=Spec().sessions)
    ap.add_argument("--turns", type=int, default=Spec().turns)
    ap.add_argument("--rate", type=float, default=Spec().rate)
    ap.add_argument("--seed", type=int, default=Spec().seed)
    ap.add_argument("--api", choices=("chat", "messages"), default="chat")
    ap.add_argument("--smoke", action="store_true", help="a small run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="write the trace into this directory")
    args = ap.parse_args()
    spec = Spec(args.sessions, args.turns, args.rate, args.seed, args.api)
    if args.smoke:
        spec = replace(SMOKE, api=args.api)
    result = run(spec, args.keep)
    print(json.dumps(result, indent=2) if args.json else table(result))
    perfect = all(
        result[v]["named"] == result[v]["injected"] and not result[v]["false_causes"]
        for v in result
        if v in ("as_sent", "after")
    )
    return 0 if perfect else 1


if __name__ == "__main__":
    sys.exit(main())
