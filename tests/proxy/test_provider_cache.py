"""provider_cache through the request flow: one prompt_cache_key per lineage (its
forks included) and tenant, retention, breakpoints and their TTL on /v1/messages,
diagnostics naming the lineage's previous response, dollars and verdicts counted
from what the upstream answered."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from canonicalize import CHAT, MESSAGES, RESPONSES
from proxy.app import create_app
from proxy.config import load
from tests import hermes
from tests.flows import Harness

CC = b'"cache_control":{"type":"ephemeral"}'
CC_1H = b'"cache_control":{"type":"ephemeral","ttl":"1h"}'
USER1 = {"role": "user", "content": "List the files in the repo."}
REPLY1 = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
    ],
}
TOOL1 = {"role": "tool", "tool_call_id": "c1", "content": "README.md\nsetup.py"}
REPLY2 = {"role": "assistant", "content": "There are two files."}


def _harness(clock: Any = None, **provider_cache: Any) -> Harness:
    overrides = {f"provider_cache.{k}": v for k, v in provider_cache.items()}
    return Harness(config=load(None, env={}, overrides=overrides), clock=clock)


def _turn(messages: list[Any], **kw: Any) -> dict[str, Any]:
    return hermes.request(hermes.system_prompt(**kw), messages, hermes.tools_full())


def test_one_key_per_lineage_and_its_forks_another_per_lineage_and_tenant() -> None:
    h = _harness(prompt_cache_key="lineage")
    first = h.send(_turn([USER1]), reply=REPLY1)
    key = first.body["prompt_cache_key"]
    assert key.startswith("pp-") and len(key) == 27
    second = h.send(_turn([USER1, REPLY1, TOOL1]), reply=REPLY2)
    assert second.role == "continuation" and second.body["prompt_cache_key"] == key
    fork_body = hermes.request(
        hermes.system_prompt(session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW),
        [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}],
        hermes.tools_review(),
    )
    fork = h.send(fork_body)
    assert fork.role == "fork" and fork.body["prompt_cache_key"] == key
    other = h.send(_turn([{"role": "user", "content": "Something else entirely."}], session="20260601_000000_aaaaaa"))
    assert other.role == "root" and other.body["prompt_cache_key"] != key
    elsewhere = h.send(_turn([USER1]), headers={"authorization": "Bearer sk-other"})
    assert elsewhere.body["prompt_cache_key"] not in (key, other.body["prompt_cache_key"])


def test_the_key_is_one_member_added_last_and_a_client_key_is_kept() -> None:
    h = _harness(prompt_cache_key="lineage")
    raw = b'{"model":"m" ,"messages":[{"role":"user","content":"hi"}],"temperature":0.50 }'
    out = h.send(raw)
    key = out.body["prompt_cache_key"]
    assert out.raw == raw[:-1] + b',"prompt_cache_key":' + orjson.dumps(key) + b"}"
    mine = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt_cache_key":"mine"}'
    assert h.send(mine).raw == mine


def test_off_by_default_and_no_key_on_messages() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    assert Harness().send(raw).raw == raw
    h = _harness(prompt_cache_key="lineage")
    assert b"prompt_cache_key" not in h.send(raw, exchange=MESSAGES).raw


MESSAGES_RAW = (
    b'{"model":"claude-x","max_tokens":16,"system":"Be brief.  ","tools":[{"name":"ls","input_schema":'
    b'{"type":"object","x":1.50}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant",'
    b'"content":[{"type":"text","text":"hello"}]},{"role":"user","content":"more"}]}'
)


def _marked(raw: bytes, first: bytes = CC) -> bytes:
    """``raw`` with prefixpin's two breakpoints: the system (made one block) with ``first``, the reply."""
    return raw.replace(b'"Be brief.  "', b'[{"type":"text","text":"Be brief.  ",' + first + b"}]").replace(
        b'"text":"hello"}', b'"text":"hello",' + CC + b"}"
    )


def test_breakpoints_through_the_flow_bytes_outside_them_as_sent() -> None:
    h = _harness(anthropic_breakpoints="auto")
    raw = MESSAGES_RAW
    out = h.send(raw, exchange=MESSAGES)
    assert out.raw == _marked(raw)
    own = raw.replace(b'"text":"hello"}', b'"text":"hello","cache_control":{"type":"ephemeral","ttl":"1h"}}')
    assert h.send(own, exchange=MESSAGES).raw == own
    assert Harness().send(raw, exchange=MESSAGES).raw == raw


def test_a_one_hour_ttl_on_the_system_and_tools_breakpoint_only() -> None:
    h = _harness(anthropic_breakpoints="auto", anthropic_ttl="1h")
    out = h.send(MESSAGES_RAW, exchange=MESSAGES)
    assert out.raw == _marked(MESSAGES_RAW, CC_1H)
    assert out.raw.index(CC_1H) < out.raw.index(CC)  # 1h before 5m, as Anthropic requires
    # Breakpoints of the client's own are left alone, TTLs and all.
    own = MESSAGES_RAW.replace(b'"text":"hello"}', b'"text":"hello",' + CC + b"}")
    assert h.send(own, exchange=MESSAGES).raw == own
    # Without breakpoints of prefixpin's own, the TTL changes nothing.
    assert _harness(anthropic_ttl="1h").send(MESSAGES_RAW, exchange=MESSAGES).raw == MESSAGES_RAW


class Clock:
    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now


def _conversation(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q0"}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"q{i}"}]
    return {"model": "claude-x", "max_tokens": 8, "system": "You are helpful.", "messages": messages}


def _ttls(h: Harness, clock: Clock, gaps: list[float]) -> list[str]:
    """The system breakpoint's TTL on each turn of one conversation, turns ``gaps`` seconds apart."""
    out = []
    for turn, gap in enumerate([0.0, *gaps], 1):
        clock.now += gap
        reply = {"role": "assistant", "content": f"a{turn}"}  # what the next turn replays
        sent = h.send(_conversation(turn), exchange=MESSAGES, reply=reply)
        assert sent.role == ("root" if turn == 1 else "continuation")
        out.append("1h" if CC_1H in sent.raw else "5m")
    return out


def test_auto_ttl_follows_each_lineages_pauses() -> None:
    clock = Clock()
    h = _harness(clock, anthropic_breakpoints="auto", anthropic_ttl="auto")
    # A tool loop (seconds apart), then a person who reads and types for 10 minutes:
    # from that pause on, the lineage's system+tools are written for an hour.
    assert _ttls(h, clock, [4, 3, 600, 5, 2]) == ["5m", "5m", "5m", "1h", "1h", "1h"]
    record = h.send(_conversation(7), exchange=MESSAGES).record
    assert record.pauses == (600,) and record.at == clock.now
    # Another conversation of the same tenant pauses over an hour each time: 1h would
    # expire as well, and cost more to write.
    other = Harness(config=h.offline.s.config, clock=clock)
    assert _ttls(other, clock, [4000, 5000]) == ["5m", "5m", "5m"]


def test_auto_ttl_weighs_the_models_prices() -> None:
    clock = Clock()
    # A model whose cache writes cost no more than input: one pause does not pay for 2x.
    flat = {"claude-x": {"input": 3, "cached_input": 0.3, "cache_write": 3, "output": 15}}
    h = _harness(clock, anthropic_breakpoints="auto", anthropic_ttl="auto", prices=flat)
    assert _ttls(h, clock, [600, 600]) == ["5m", "5m", "1h"]


def test_auto_ttl_on_chat_completions_through_litellm() -> None:
    clock = Clock()
    config = load(
        None,
        env={},
        overrides={
            "upstream.kind": "litellm",
            "provider_cache.anthropic_breakpoints": "auto",
            "provider_cache.anthropic_ttl": "auto",
        },
    )
    h = Harness(config=config, clock=clock)
    chat: dict[str, Any] = {"model": "anthropic/claude-x", "messages": [{"role": "system", "content": "s"}]}
    sent = []
    for i, gap in enumerate((0, 900)):
        clock.now += gap
        chat["messages"] = [*chat["messages"], {"role": "user", "content": f"q{i}"}]
        sent.append(h.send(chat, reply={"role": "assistant", "content": f"a{i}"}).raw)
        chat["messages"].append({"role": "assistant", "content": f"a{i}"})
    assert b'"content":"s",' + CC + b"}" in sent[0]
    assert b'"content":"s",' + CC_1H + b"}" in sent[1] and b'"content":"a0",' + CC + b"}" in sent[1]


def test_retention_on_chat_and_responses_unless_the_client_chose() -> None:
    h = _harness(openai_retention="24h")
    raw = b'{"model":"m" ,"messages":[{"role":"user","content":"hi"}],"temperature":0.50 }'
    assert h.send(raw).raw == raw[:-1] + b',"prompt_cache_retention":"24h"}'
    for own in (b',"prompt_cache_retention":"in_memory"', b',"prompt_cache_options":{"mode":"auto","ttl":"1h"}'):
        mine = raw[:-2] + own + b"}"
        assert h.send(mine).raw == mine
    responses = b'{"model":"m","input":[{"role":"user","content":"hi"}],"max_output_tokens":1e3}'
    assert h.send(responses, exchange=RESPONSES).raw == responses[:-1] + b',"prompt_cache_retention":"24h"}'
    options = responses[:-1] + b',"prompt_cache_options":{"mode":"explicit"}}'
    assert h.send(options, exchange=RESPONSES).raw == options
    assert b"prompt_cache_retention" not in h.send(MESSAGES_RAW, exchange=MESSAGES).raw
    assert Harness().send(raw, exchange=CHAT).raw == raw


# -- dollars and verdicts, in-process with a fake upstream ---------------------------------


class Upstream:
    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, bytes):  # a stream
            return httpx.Response(200, content=answer, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=answer)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


PRICE = {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}


def test_cost_saved_and_verdicts_from_the_answers() -> None:
    config = load(
        None,
        env={},
        overrides={"provider_cache.prices": {"claude-x": PRICE, "claude-y": PRICE}},
    )
    up = Upstream()
    usage1 = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 1000,
        "cache_read_input_tokens": 0,
        "output_tokens": 10,
    }
    usage2 = {
        "input_tokens": 50,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1000,
        "output_tokens": 20,
    }
    reply = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    up.answers = [
        {**reply, "id": "msg_1", "usage": usage1},
        {**reply, "id": "msg_2", "usage": usage2, "diagnostics": {"cache_miss_reason": None}},
        {**reply, "id": "msg_3", "usage": usage1, "diagnostics": {"cache_miss_reason": {"type": "model_changed"}}},
        {**reply, "id": "msg_4", "usage": usage1, "diagnostics": {"cache_miss_reason": {"type": "tools_changed"}}},
    ]
    body: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 16,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"x-api-key": "sk-ant-test"}
    with TestClient(create_app(config, transport=httpx.MockTransport(up))) as client:
        for _ in range(2):
            assert client.post("/v1/messages", json=body, headers=headers).status_code == 200
            body = copy.deepcopy(body)
            body["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
        body["model"] = "claude-y"  # prefixpin sees model_changed, as the provider does
        assert client.post("/v1/messages", json=body, headers=headers).status_code == 200
        body["model"] = "claude-x"
        body["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        assert client.post("/v1/messages", json=body, headers=headers).status_code == 200  # we say: no break
        text = client.get("/metrics").text
    cost1 = (100 * 3 + 1000 * 3.75 + 10 * 15) / 1e6
    cost2 = (50 * 3 + 1000 * 0.3 + 20 * 15) / 1e6
    assert _metric(text, 'prefixpin_cost_usd_total{model="claude-x"}') == pytest.approx(2 * cost1 + cost2)
    assert _metric(text, 'prefixpin_cost_usd_total{model="claude-y"}') == pytest.approx(cost1)
    # The reads' saving minus the writes' extra cost: claude-y only wrote, and saved less than nothing.
    assert _metric(text, 'prefixpin_saved_usd_total{model="claude-x"}') == pytest.approx(
        (1000 * 2.7 - 2 * 1000 * 0.75) / 1e6
    )
    assert _metric(text, 'prefixpin_saved_usd_total{model="claude-y"}') == pytest.approx(-1000 * 0.75 / 1e6)
    assert _metric(text, 'prefixpin_cache_verdicts_total{agree="yes"}') == 2
    assert _metric(text, 'prefixpin_cache_verdicts_total{agree="no"}') == 1


def test_a_repaired_messages_fork_gets_its_breakpoints_in_the_parents_bytes() -> None:
    h = _harness(anthropic_breakpoints="auto")
    tools = [
        {"name": "memory", "description": "Save a fact.", "input_schema": {"type": "object"}},
        {"name": "terminal", "description": "Run a command.", "input_schema": {"type": "object"}},
    ]
    user = {"role": "user", "content": "List the files."}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "README.md"}]}
    first = {"model": "c", "system": "You are helpful.", "tools": tools, "messages": [user]}
    parent = h.send(first, exchange=MESSAGES, reply=reply)
    fork_body = {
        "model": "c",
        "system": "You review.",
        "tools": tools[:1],
        "messages": [user, reply, {"role": "user", "content": "Review the conversation."}],
    }
    fork = h.send(fork_body, exchange=MESSAGES, declared=parent.record.id)
    assert fork.role == "fork" and fork.fork_action == "repaired", fork.role
    sent = fork.body
    # The parent's system as recorded (made one block by its breakpoint), marked again.
    assert sent["system"] == [{"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}]
    assert [t["name"] for t in sent["tools"]] == ["memory", "terminal"]
    assert sent["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert fork.raw.count(b"cache_control") == 2


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def test_diagnostics_name_the_lineages_previous_response() -> None:
    config = load(None, env={}, overrides={"provider_cache.diagnostics": "auto"})
    up = Upstream()
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
    reply = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}], "usage": usage}
    streamed = _sse(
        {"type": "message_start", "message": {**reply, "id": "msg_2", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    )
    up.answers = [{**reply, "id": "msg_1"}, streamed, {**reply, "id": "msg_3"}, {**reply, "id": "msg_4"}]
    raw = b'{"model":"claude-x","max_tokens":16,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}'
    turns = [raw]
    for n in range(2, 5):
        turns.append(turns[-1][:-2] + b',{"role":"assistant","content":"ok"},{"role":"user","content":"q%d"}]}' % n)
    turns[1] = turns[1][:-1] + b',"stream":true}'
    own = b',"diagnostics":{"previous_message_id":"msg_x"}'
    turns[3] = turns[3][:-1] + own + b"}"
    headers = {"x-api-key": "sk-ant-test", "anthropic-beta": "files-api-2025-04-14"}
    with TestClient(create_app(config, transport=httpx.MockTransport(up))) as client:
        for body in turns:
            assert client.post("/v1/messages", content=body, headers=headers).status_code == 200
    sent = [r.content for r in up.requests]
    betas = [r.headers.get_list("anthropic-beta") for r in up.requests]
    assert sent[0] == turns[0] and betas[0] == ["files-api-2025-04-14"]  # the lineage's first: nothing to name
    assert sent[1] == turns[1][:-1] + b',"diagnostics":{"previous_message_id":"msg_1"}}'
    assert betas[1] == ["files-api-2025-04-14,cache-diagnosis-2026-04-07"]
    assert sent[2] == turns[2][:-1] + b',"diagnostics":{"previous_message_id":"msg_2"}}'  # read from the stream
    assert sent[3] == turns[3] and betas[3] == ["files-api-2025-04-14"]  # the client's own are kept
    off = Upstream()
    off.answers = [{**reply, "id": "msg_1"}, {**reply, "id": "msg_2"}]
    with TestClient(create_app(load(None, env={}), transport=httpx.MockTransport(off))) as client:
        for body in turns[:2]:
            client.post("/v1/messages", content=body.replace(b',"stream":true', b""), headers=headers)
    assert b"diagnostics" not in off.requests[1].content
