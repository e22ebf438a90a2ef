"""The captured traffic of real agents no pack knows (tests/agents/data, recaptured by
tests/agents/capture.py), replayed through prefixpin's request flow: ``learn: pin``
keeps more of their prompts cacheable and changes nothing a user wrote; ``suggest``
forwards what ``off`` does, byte for byte; nothing is learned across tenants."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from benchmarks import bench_agents
from benchmarks.overhead import mix
from benchmarks.overhead.targets import CLIENT_HEADERS as HEADERS
from canonicalize import learn, textdiff
from canonicalize.ruleset import Settings
from canonicalize.wire import match
from proxy.config import load as load_config
from proxy.offline import Offline
from proxy.store import Bounds
from proxy.store.memory import MemoryStore
from tests.agents.capture import AGENTS, load
from tests.proxy.test_store import WalkingStore

AGENT_NAMES = sorted(AGENTS)


@pytest.mark.parametrize("agent", AGENT_NAMES)
def test_pin_keeps_more_of_the_prompts_cacheable(agent: str) -> None:
    figures = bench_agents.measure(agent, load(agent))
    assert figures.pin > figures.direct
    assert figures.pin <= figures.ideal + 1e-9


def test_qwen_code_keeps_its_first_message_across_invocations_and_days() -> None:
    lines = load("qwen-code")
    flows = asyncio.run(bench_agents.through(lines, "pin"))
    main = [(line, f) for line, f in zip(lines, flows, strict=True) if _main(line)]
    # Its next invocation drops the date reminder from the first message: forwarded as recorded.
    resumed = [f for line, f in main if line["invocation"] == 1 and line["session"] == "a"]
    assert resumed[0].role == "continuation" and "learned.history" in resumed[0].rewrites
    # Session b resumed the next day: the startup date is the agent's template (session a
    # sent that line too): pinned, the model told the date; the user's words as sent.
    line, flow = next((line, f) for line, f in main if line["session"] == "b" and line["day"] == 1)
    assert flow.role == "continuation" and "learned.date" in flow.rewrites
    sent, out = line["body"]["messages"], orjson.loads(flow.out)["messages"]
    said, told = sent[-1]["content"][-1]["text"], out[-1]["content"][-1]["text"]
    assert told.startswith(said + "\n\n(Note: the current date is now ")
    assert out[-1]["content"][:-1] == sent[-1]["content"][:-1]
    assert out[2:-1] == sent[2:-1]  # nothing else of the history changed


def test_aider_pins_its_current_date_and_tells_it() -> None:
    lines = load("aider")
    flows = asyncio.run(bench_agents.through(lines, "pin"))
    day2 = [(line, f) for line, f in zip(lines, flows, strict=True) if line["day"] == 1]
    assert day2 and all("learned.date" in f.rewrites for _, f in day2)
    for line, f in day2:
        system = orjson.loads(f.out)["messages"][0]["content"]
        assert system != line["body"]["messages"][0]["content"]  # the first day's date
        assert "(Note: the current date is now " in _text(orjson.loads(f.out)["messages"][-1])


@pytest.mark.parametrize("agent", AGENT_NAMES)
def test_suggest_forwards_what_off_forwards(agent: str) -> None:
    lines = load(agent)
    off = asyncio.run(bench_agents.through(lines, "off"))
    suggest = asyncio.run(bench_agents.through(lines, "suggest"))
    assert [f.out for f in suggest] == [f.out for f in off]
    assert [f.role for f in suggest] == [f.role for f in off]


def test_nothing_is_learned_across_tenants() -> None:
    # Session b in another tenant: session a's template lines are not b's evidence.
    lines = [{**line, "headers": {"authorization": f"Bearer sk-{line['session']}"}} for line in load("qwen-code")]
    flows = asyncio.run(bench_agents.through(lines, "pin"))
    b2 = next(f for line, f in zip(lines, flows, strict=True) if _main(line) and line["session"] == "b" and line["day"])
    assert "learned.date" not in b2.rewrites and b2.role == "root"


def test_qwen_codes_side_requests_are_told_apart_without_tokenizing() -> None:
    # Its side requests (a system prompt of its own that replays the conversation) are
    # compared with the main loop's prompt they replay: most of it in runs past
    # MAX_HUNK, it cannot keep MIN_KEPT of it; nothing is tokenized, nothing learned.
    lines = load("qwen-code")
    main = next(_text(line["body"]["messages"][0]) for line in lines if _main(line))
    sides = {_text(line["body"]["messages"][0]) for line in lines if not _main(line)}
    assert sides
    for side in sides:
        diff = textdiff.changes(main, side, keep=learn.MIN_KEPT)
        assert diff.kept < learn.MIN_KEPT and diff.spent.chars == 0


def _main(line: dict[str, Any]) -> bool:
    return str(line["body"]["messages"][0]["content"]).startswith("You are Qwen Code")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@pytest.mark.parametrize("agent", [*AGENT_NAMES, "overhead mix"])
@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "small"])
def test_the_embedded_store_forwards_as_it_would_walking_every_lookup(agent: str, bounded: bool) -> None:
    """The captured agents (learn: pin) and three turns of the overhead benchmark's
    conversation mix through the request flow, once on the embedded store and once on
    one that walks every lookup, unbounded and under a bound that evicts (the mix's
    oldest links go): the same bytes forwarded, the same roles and rewrites."""
    if agent == "overhead mix":
        lines = [
            {"path": "/v1/chat/completions", "body": orjson.loads(t.replace(mix.GEN, "00000001")), "headers": HEADERS}
            for t in mix.templates(12, 3)
        ]
    else:
        lines = load(agent)
    bounds = Bounds(600, 2**30, 256) if bounded else Bounds(10**9, 2**62, 256)

    async def through(store: MemoryStore) -> list[tuple[str, bytes, tuple[str, ...]]]:
        offline = Offline(load_config(None, env={}), settings=Settings(learn="pin"), store=store)
        out = []
        for line in lines:
            exchange = match(line["path"])
            assert exchange is not None
            reply = line.get("response")
            flow = await offline.send(line["body"], exchange=exchange, headers=line["headers"], reply=reply)
            out.append((flow.role, flow.out, tuple(flow.rewrites)))
        return out

    stores = [cls(max_entries=bounds.tenant_max_entries, bounds=bounds) for cls in (MemoryStore, WalkingStore)]
    fast, walked = (asyncio.run(through(s)) for s in stores)
    assert fast == walked
    assert {role for role, _, _ in fast} >= {"root", "continuation"}
