"""The benchmark's trace generator: seeded, and its forks differ from their parents
exactly as hermes' legacy review forks did (seed 000's diff), no more, no less."""

from __future__ import annotations

import difflib
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.traces import REVIEW_TOOL_NAMES, SMOKE, TraceSpec, generate, write_pair

Json = dict[str, Any]

# The formats of shared/agents/volatile.json (hermes entries).
STARTED = re.compile(
    r"^Conversation started: (?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December) "
    r"\d{2}, \d{4} \d{2}:\d{2} (?:AM|PM)$"
)
SESSION_ID = re.compile(r"^Session ID: \d{8}_\d{6}_[0-9a-f]{6,8}$")
MEMORY = re.compile(r"^MEMORY \(your personal notes\) \[\d{1,3}% — [\d,]+/[\d,]+ chars\]$")
USER = re.compile(r"^USER PROFILE \(who the user is\) \[\d{1,3}% — [\d,]+/[\d,]+ chars\]$")
SPEC = TraceSpec(sessions=3, turns=6, fork_every=3, seed=11)


@pytest.fixture(scope="module")
def pair() -> tuple[list[Json], list[Json]]:
    return generate(SPEC)


def system(line: Json) -> str:
    msgs = line["body"]["messages"]
    assert msgs[0]["role"] == "system"
    return str(msgs[0]["content"])


def history(line: Json) -> list[Json]:
    return list(line["body"]["messages"][1:])


def tool_names(line: Json) -> list[str]:
    return [t["function"]["name"] for t in line["body"]["tools"]]


def first_forks(trace: list[Json]) -> list[tuple[Json, Json]]:
    """(parent, fork) for each fork's first request: the parent is the turn request before it."""
    out = []
    for i, line in enumerate(trace):
        if line["kind"] == "fork" and trace[i - 1]["kind"] != "fork":
            out.append((trace[i - 1], line))
    return out


def line_of(text: str, pattern: re.Pattern[str]) -> str:
    return next(ln for ln in text.splitlines() if pattern.match(ln))


def test_is_deterministic_per_seed() -> None:
    assert generate(SPEC) == generate(SPEC)
    assert generate(SPEC) != generate(TraceSpec(sessions=3, turns=6, fork_every=3, seed=12))


def test_writes_both_traces_as_json_lines(tmp_path: Path) -> None:
    pre_path, ideal_path = write_pair(tmp_path, SMOKE)
    pre, ideal = generate(SMOKE)
    assert [json.loads(ln) for ln in pre_path.read_text().splitlines()] == pre
    assert [json.loads(ln) for ln in ideal_path.read_text().splitlines()] == ideal


def test_both_traces_have_the_same_lines_in_the_same_order(pair) -> None:
    pre, ideal = pair
    assert len(pre) == len(ideal)
    for p, i in zip(pre, ideal, strict=True):
        assert (p["kind"], p["session"], p["turn"], p["t"]) == (i["kind"], i["session"], i["turn"], i["t"])
        assert history(p) == history(i)
        assert {k: v for k, v in p["body"].items() if k not in ("messages", "tools")} == {
            k: v for k, v in i["body"].items() if k not in ("messages", "tools")
        }


def test_shape_sessions_turns_forks(pair) -> None:
    pre, _ = pair
    assert [ln["session"] for ln in pre if ln["kind"] == "root"] == ["s1", "s2", "s3"]
    assert len(first_forks(pre)) == SPEC.sessions * (SPEC.turns // SPEC.fork_every)
    assert all(ln["t"] <= nxt["t"] for ln, nxt in itertools.pairwise(pre))
    for line in pre:
        roles = [m["role"] for m in history(line)]
        assert roles[0] == "user" and roles[-1] in ("user", "tool")
        assert "assistant" in roles or line["kind"] == "root"


def test_system_and_tools_are_hermes_sized(pair) -> None:
    pre, _ = pair
    body = pre[0]["body"]
    size = len(system(pre[0]).encode()) + len(json.dumps(body["tools"]).encode())
    assert 2_500 <= size <= 3_600  # ~3K tokens for a byte-level tokenizer
    assert len(body["tools"]) == 10
    for pattern in (STARTED, SESSION_ID, MEMORY, USER):
        line_of(system(pre[0]), pattern)
    assert "<available_skills>" in system(pre[0]) and "    - maps: " in system(pre[0])


def test_every_request_extends_the_previous_one_of_its_session(pair) -> None:
    pre, _ = pair
    last: dict[str, list[Json]] = {}
    for line in pre:
        if line["kind"] == "fork":
            continue
        prev = last.get(line["session"], [])
        assert history(line)[: len(prev)] == prev
        last[line["session"]] = history(line)


def test_pre_fix_fork_differs_from_its_parent_exactly_as_documented(pair) -> None:
    pre, _ = pair
    for parent, fork in first_forks(pre):
        lines = difflib.unified_diff(system(parent).splitlines(), system(fork).splitlines(), lineterm="", n=0)
        diff = [ln for ln in lines if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        removed = [ln[1:] for ln in diff if ln.startswith("-")]
        added = [ln[1:] for ln in diff if ln.startswith("+")]
        # 1. the terminal/web-gated skills are gone (and their category header when it empties)
        assert "    - maps: Geocode, POIs, routes, timezones via OpenStreetMap/OSRM." in removed
        assert any(ln.startswith("    - docker-ops: ") for ln in removed)
        # 2. a fresh minute, 3. a fresh Session ID (same format), nothing else added
        p_start, f_start = line_of(system(parent), STARTED), line_of(system(fork), STARTED)
        p_sid, f_sid = line_of(system(parent), SESSION_ID), line_of(system(fork), SESSION_ID)
        assert p_start != f_start and p_sid != f_sid
        assert p_sid.rpartition("_")[0] == f_sid.rpartition("_")[0]
        assert sorted(added) == sorted([f_start, f_sid])
        assert sorted(set(removed) - {p_start, p_sid}) == sorted(
            ln for ln in removed if ln.startswith("    - ") or ln.rstrip().endswith(":")
        )
        # 4. tools[] narrowed to the review toolset, each tool as the parent sent it
        assert tool_names(fork) == list(REVIEW_TOOL_NAMES)
        assert fork["body"]["tools"] == [
            t for t in parent["body"]["tools"] if t["function"]["name"] in REVIEW_TOOL_NAMES
        ]
        # the history is the parent's, its last reply, and a review prompt
        hist = history(fork)
        assert hist[: len(history(parent))] == history(parent)
        assert hist[len(history(parent))]["role"] == "assistant"
        assert hist[len(history(parent)) + 1]["content"].startswith("Review the conversation above and ")
        assert len(hist) == len(history(parent)) + 2


def test_ideal_fork_reuses_the_parents_system_bytes_and_tools(pair) -> None:
    pre, ideal = pair
    assert len(first_forks(ideal)) == len(first_forks(pre))
    for parent, fork in first_forks(ideal):
        assert system(fork) == system(parent)
        assert fork["body"]["tools"] == parent["body"]["tools"]


def test_ideal_trace_keeps_one_system_prompt_and_tools_per_session(pair) -> None:
    _, ideal = pair
    by_session: dict[str, set[str]] = {}
    for line in ideal:
        by_session.setdefault(line["session"], set()).add(system(line) + json.dumps(line["body"]["tools"]))
    assert all(len(v) == 1 for v in by_session.values())
    assert len({next(iter(v)) for v in by_session.values()}) == SPEC.sessions  # own Session ID each


def test_pre_fix_turns_get_a_new_minute_and_counters_move_after_a_memory_write(pair) -> None:
    pre, _ = pair
    s1 = [ln for ln in pre if ln["session"] == "s1" and ln["kind"] != "fork"]
    minutes = {ln["turn"]: line_of(system(ln), STARTED) for ln in s1}
    per_turn = {(ln["turn"], system(ln)) for ln in s1}
    assert len(per_turn) == SPEC.turns  # one system prompt per turn: constant inside a turn
    assert len(set(minutes.values())) == SPEC.turns
    assert len({line_of(system(ln), SESSION_ID) for ln in s1}) == 1
    memory = [line_of(system(ln), MEMORY) for ln in s1]
    before = {line_of(system(ln), MEMORY) for ln in s1 if ln["turn"] < SPEC.fork_every}
    after = {line_of(system(ln), MEMORY) for ln in s1 if ln["turn"] >= SPEC.fork_every}
    assert len(before) == len(after) == 1 and before != after, memory
    assert {line_of(system(ln), USER) for ln in s1} == {line_of(system(s1[0]), USER)}


def test_review_fork_has_its_own_tool_loop(pair) -> None:
    pre, _ = pair
    for i, line in enumerate(pre):
        if line["kind"] == "fork" and pre[i - 1]["kind"] == "fork":
            first = pre[i - 1]
            assert system(line) == system(first) and line["body"]["tools"] == first["body"]["tools"]
            assert history(line)[: len(history(first))] == history(first)
            call = history(line)[-2]["tool_calls"][0]["function"]
            assert call["name"] == "memory"
            assert history(line)[-1]["role"] == "tool"
