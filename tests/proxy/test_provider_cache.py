"""provider_cache through the request flow: one prompt_cache_key per lineage (its
forks included) and tenant, retention, breakpoints and their TTL on /v1/messages,
diagnostics naming the lineage's previous response, dollars and verdicts counted
from what the upstream answered."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import orjson
import prometheus_client
import pytest
from starlette.testclient import TestClient

from canonicalize import CHAT, MESSAGES, RESPONSES
from proxy.addons.provider_cache import ProviderCache
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


# -- OpenAI: explicit breakpoints, Responses diagnostics, minimums ------------------------

BP = b'"prompt_cache_breakpoint":{"mode":"explicit"}'
OPENAI_CHAT = (
    b'{"model":"gpt-5.6" ,"messages":[{"role":"system","content":"Be brief.  "},{"role":"user","content":"hi"},'
    b'{"role":"assistant","content":"hello"},{"role":"user","content":"more"}],"temperature":0.50 }'
)


def _bp(text: bytes, kind: bytes = b"text") -> bytes:
    return b'[{"type":"' + kind + b'","text":' + text + b"," + BP + b"}]"


def test_openai_breakpoints_on_chat_bytes_outside_them_as_sent() -> None:
    h = _harness(openai_breakpoints="auto")
    out = h.send(OPENAI_CHAT)
    assert out.raw == OPENAI_CHAT.replace(b'"Be brief.  "', _bp(b'"Be brief.  "')).replace(
        b'"content":"hi"', b'"content":' + _bp(b'"hi"')
    )
    # The client's own breakpoint: the request is left alone.
    own = OPENAI_CHAT.replace(b'"content":"more"', b'"content":' + _bp(b'"more"'))
    assert h.send(own).raw == own
    assert Harness().send(OPENAI_CHAT).raw == OPENAI_CHAT  # off by default
    assert b"prompt_cache_breakpoint" not in h.send(MESSAGES_RAW, exchange=MESSAGES).raw


def test_openai_breakpoints_with_retention_never_set_both_and_keep_the_clients_options() -> None:
    h = _harness(openai_breakpoints="auto", openai_retention="24h")
    out = h.send(OPENAI_CHAT)
    assert out.raw.endswith(b',"prompt_cache_retention":"24h"}') and out.raw.count(BP) == 2
    assert b"prompt_cache_options" not in out.raw
    options = OPENAI_CHAT[:-1] + b',"prompt_cache_options":{"mode":"explicit","ttl":"30m"}}'
    sent = h.send(options).raw
    assert b"prompt_cache_retention" not in sent and sent.count(BP) == 2
    assert sent.endswith(b'"prompt_cache_options":{"mode":"explicit","ttl":"30m"}}')


RESPONSES_RAW = (
    b'{"model":"gpt-5.6","instructions":"Be careful.","input":[{"role":"developer","content":"<rules>"},'
    b'{"role":"user","content":"Fix it."},{"type":"function_call","call_id":"c1","name":"shell","arguments":"{}"},'
    b'{"type":"function_call_output","call_id":"c1","output":"ok"},{"role":"user","content":"Thanks."}],'
    b'"max_output_tokens":1e3}'
)


def test_openai_breakpoints_on_responses() -> None:
    h = _harness(openai_breakpoints="auto")
    out = h.send(RESPONSES_RAW, exchange=RESPONSES)
    assert out.raw == RESPONSES_RAW.replace(b'"<rules>"', _bp(b'"<rules>"', b"input_text")).replace(
        b'"output":"ok"', b'"output":' + _bp(b'"ok"', b"input_text")
    )


def test_openai_breakpoints_through_litellm_not_for_anthropic_models() -> None:
    config = load(None, env={}, overrides={"upstream.kind": "litellm", "provider_cache.openai_breakpoints": "auto"})
    h = Harness(config=config)
    assert h.send(OPENAI_CHAT.replace(b'"gpt-5.6"', b'"openai/gpt-5.6"')).raw.count(BP) == 2
    anthropic = OPENAI_CHAT.replace(b'"gpt-5.6"', b'"anthropic/claude-x"')
    assert h.send(anthropic).raw == anthropic  # LiteLLM would drop them; Anthropic has its own


def test_a_repaired_chat_fork_gets_its_openai_breakpoints_in_the_parents_bytes() -> None:
    h = _harness(openai_breakpoints="auto")
    parent = h.send(_turn([USER1]), reply=REPLY1)
    assert parent.raw.count(BP) == 1  # the system only: nothing before the first user message
    fork_body = hermes.request(
        hermes.system_prompt(session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW),
        [USER1, REPLY1, TOOL1, REPLY2, {"role": "user", "content": hermes.REVIEW_PROMPT}],
        hermes.tools_review(),
    )
    fork = h.send(fork_body)
    assert fork.role == "fork" and fork.fork_action == "repaired"
    sent = fork.body["messages"]
    assert sent[0]["content"] == parent.body["messages"][0]["content"]  # the parent's, its breakpoint once
    assert sent[0]["content"][-1]["prompt_cache_breakpoint"] == {"mode": "explicit"}
    assert sent[3]["content"] == [  # the tool result: the newest user or tool message before the last user one
        {"type": "text", "text": TOOL1["content"], "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]
    assert fork.raw.count(BP) == 2


def _responses_sse(response_id: str, usage: dict[str, Any], diagnostics: Any = None) -> bytes:
    item = {"type": "message", "id": "m" + response_id, "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": "ok", "annotations": []}]
    done: dict[str, Any] = {"id": response_id, "object": "response", "status": "completed", "output": [item]}
    done["usage"] = usage
    if diagnostics is not None:
        done["prompt_cache_diagnostics"] = diagnostics
    return _sse(
        {"type": "response.created", "response": {"id": response_id, "object": "response", "output": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    )


def test_responses_diagnostics_name_the_lineages_previous_response() -> None:
    config = load(None, env={}, overrides={"provider_cache.diagnostics": "auto"})
    up = Upstream()
    usage = {"input_tokens": 2000, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}}
    item = {"type": "message", "id": "m", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": "ok", "annotations": []}]
    reply = {"object": "response", "status": "completed", "output": [item], "usage": usage}
    up.answers = [
        {**reply, "id": "resp_1"},
        _responses_sse("resp_2", usage, {"type": "cache_hit"}),
        {**reply, "id": "resp_3", "prompt_cache_diagnostics": {"type": "cache_miss", "reason": "input_changed"}},
        {**reply, "id": "resp_4", "prompt_cache_diagnostics": {"type": "comparison_response_not_found"}},
    ]
    raw = b'{"model":"gpt-5.6","input":[{"role":"user","content":"hi"}],"max_output_tokens":1e3}'
    turns = [raw]
    for n in range(2, 5):
        more = b',{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},'
        turns.append(turns[-1].replace(b'}],"max', b"}" + more + b'{"role":"user","content":"q%d"}],"max' % n))
    turns[1] = turns[1][:-1] + b',"stream":true}'
    turns[2] = turns[2][:-1] + b',"prompt_cache_options":{"mode":"implicit"}}'
    turns[3] = turns[3][:-1] + b',"prompt_cache_options":{"comparison_response_id":"resp_x"}}'
    headers = {"authorization": "Bearer sk-resp-diag"}
    with TestClient(create_app(config, transport=httpx.MockTransport(up))) as client:
        for body in turns:
            assert client.post("/v1/responses", content=body, headers=headers).status_code == 200
        text = client.get("/metrics").text
    sent = [r.content for r in up.requests]
    assert sent[0] == turns[0]  # the lineage's first: nothing to compare with
    assert sent[1] == turns[1][:-1] + b',"prompt_cache_options":{"comparison_response_id":"resp_1"}}'
    assert sent[2] == turns[2][:-2] + b',"comparison_response_id":"resp_2"}}'  # read from the stream
    assert sent[3] == turns[3]  # the client's own comparison is kept
    # cache_hit agrees with no break; input_changed does not (prefixpin saw the turn only extend).
    assert _metric(text, 'prefixpin_cache_verdicts_total{agree="yes"}') == 1
    assert _metric(text, 'prefixpin_cache_verdicts_total{agree="no"}') == 1


def test_no_comparison_next_to_a_retention() -> None:
    h = _harness(diagnostics="auto", openai_retention="24h")
    raw = b'{"model":"gpt-5.6","input":[{"role":"user","content":"hi"}]}'
    reply = {"role": "assistant", "id": "resp_1", "output": [{"type": "message", "role": "assistant", "content": "ok"}]}
    h.send(raw, exchange=RESPONSES, reply=reply)
    second = raw.replace(
        b'"hi"}]', b'"hi"},{"type":"message","role":"assistant","content":"ok"},{"role":"user","content":"x"}]'
    )
    sent = h.send(second, exchange=RESPONSES)
    assert sent.role == "continuation" and b"prompt_cache_options" not in sent.raw
    assert sent.raw.endswith(b',"prompt_cache_retention":"24h"}')


def _chat_usage(prompt: int, cached: int = 0, write: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": write},
        },
    }


def test_below_the_minimum_counted_per_request_and_said_once_per_lineage(caplog: pytest.LogCaptureFixture) -> None:
    config = load(
        None,
        env={},
        overrides={
            "provider_cache.min_tokens": {"small-model": 2048},
            "provider_cache.prices": {"gpt-5.6": {"input": 2, "cached_input": 0.2, "cache_write": 2.5, "output": 8}},
        },
    )
    up = Upstream()
    short = {"role": "system", "content": "Be brief."}
    long = {"role": "system", "content": "You are a careful assistant. " * 400}  # ~2,900 tokens
    up.answers = [_chat_usage(300, 0, 0), _chat_usage(320, 0, 0), _chat_usage(3000, 0, 2900), _chat_usage(100)]
    headers = {"authorization": "Bearer sk-min"}
    first = {"model": "gpt-5.6", "messages": [short, {"role": "user", "content": "hi"}]}
    second = {
        **first,
        "messages": [*first["messages"], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
    }
    caplog.set_level("INFO", logger="prefixpin")
    with TestClient(create_app(config, transport=httpx.MockTransport(up))) as client:
        for body in (first, second, {**first, "messages": [long, first["messages"][1]]}):
            assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        configured = {"model": "small-model", "messages": [short, {"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=configured, headers=headers).status_code == 200
        text = client.get("/metrics").text
    assert _metric(text, 'prefixpin_below_cache_minimum_total{model="gpt-5.6"}') == 2  # each short request
    assert _metric(text, 'prefixpin_below_cache_minimum_total{model="small-model"}') == 1
    said = [r.getMessage() for r in caplog.records if "below the" in r.getMessage()]
    assert len(said) == 2  # once for the gpt-5.6 lineage (two requests), once for the other
    assert "1024 tokens 'gpt-5.6' caches at the least" in said[0] and "Be brief" not in said[0]
    # OpenAI's cache writes priced with cache_write: the long request wrote and saved less than nothing.
    assert _metric(text, 'prefixpin_saved_usd_total{model="gpt-5.6"}') == pytest.approx(-2900 * 0.5 / 1e6)


def test_the_lineages_said_below_the_minimum_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    h = _harness(prices={"gpt-5.6": PRICE})  # priced: no lookup
    addon = next(a for a in h.offline.runner.addons if isinstance(a, ProviderCache))
    addon.said_bound = 3
    caplog.set_level("INFO", logger="prefixpin")
    answer = {"role": "assistant", "content": "ok"}
    for i in [*range(5), 0, 4]:  # five conversations, then the first (forgotten) and the last (remembered) again
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {i}"}]
        if i in (0, 4) and len(caplog.records) >= 5:
            messages += [answer, {"role": "user", "content": "and then?"}]
        sent = h.send({"model": "gpt-5.6", "messages": messages}, reply=answer)
        assert sent.role == ("continuation" if len(messages) > 1 else "root")
        flow = sent.flow
        flow.answer.reply = CHAT.reply(offered=None, drop_usage_chunk=False)
        flow.answer.reply.complete(_chat_usage(20))
        flow.answer.status = 200
        addon.done(flow)
    said = [r for r in caplog.records if "below the" in r.getMessage()]
    assert len(said) == 6  # the forgotten lineage is said again, the remembered one not
    assert len(addon._said) == 3
    text = prometheus_client.generate_latest(h.offline.s.metrics.registry).decode()
    assert _metric(text, 'prefixpin_below_cache_minimum_total{model="gpt-5.6"}') == 7


def test_the_minimums_remembered_per_model_are_bounded() -> None:
    from canonicalize import minimums
    from proxy.addons.provider_cache import MINIMUMS_KEPT

    h = _harness(prices={"gpt-5.6": PRICE})
    addon = next(a for a in h.offline.runner.addons if isinstance(a, ProviderCache))
    models: list[object] = [f"gpt-5.6-{i}" for i in range(MINIMUMS_KEPT + 10)] + ["claude-opus-4-6", None, ["x"]]
    for model in models + models:
        assert addon._least(model) == minimums.minimum(model, addon.min_tokens)
        assert len(addon._minimums) <= MINIMUMS_KEPT


def test_costs_wait_for_one_load_of_the_cost_map_bounded_then_every_model_is_priced_at_once() -> None:
    """The cost map's first load (LiteLLM imported: seconds) runs once, on a worker thread;
    the costs of the requests meanwhile wait for it in a bounded list (past it: not
    counted, a fail-open), and are counted once it is loaded; after it, every model,
    known or not, is priced on the spot (no task, no thread per request)."""
    import threading

    from proxy.addons import provider_cache
    from proxy.pricing import Pricing
    from tests.infra.wait import wait_until

    release, loads = threading.Event(), []

    def cost_map() -> dict[str, Any]:
        loads.append(1)
        assert release.wait(30)
        return {"gpt-x": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}

    up = Upstream()
    up.answers = [_chat_usage(1000) for _ in range(8)]
    app = create_app(load(None, env={}), transport=httpx.MockTransport(up))
    headers = {"authorization": "Bearer sk-cost"}
    with TestClient(app) as client:
        assert app.handler is not None
        pc = next(a for a in app.handler.runner.addons if isinstance(a, ProviderCache))
        pc.pricing = Pricing({}, cost_map=cost_map)
        bound = provider_cache.UNPRICED_KEPT
        provider_cache.UNPRICED_KEPT = 3
        try:
            for n in range(4):  # the 4th finds the list full
                body = {"model": "gpt-x", "messages": [{"role": "user", "content": f"hi {n}"}]}
                assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
            text = client.get("/metrics").text
            assert len(pc._unpriced) == 3 and loads == [1]
            assert _metric(text, 'prefixpin_fail_open_total{stage="provider_cache"}') == 1
            release.set()
            wait_until(lambda: not pc._unpriced and not pc._loading, timeout=10, message="the waiting costs counted")
            body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
            text = client.get("/metrics").text
        finally:
            provider_cache.UNPRICED_KEPT = bound
    assert loads == [1] and pc.pricing.known("any model at all")
    assert _metric(text, 'prefixpin_cost_usd_total{model="gpt-x"}') == pytest.approx(3 * (1000 * 1 + 2) / 1e6)
