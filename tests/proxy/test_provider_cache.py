"""provider_cache through the request flow: one prompt_cache_key per lineage (its
forks included) and tenant, breakpoints on /v1/messages, dollars and verdicts
counted from what the upstream answered."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from canonicalize import MESSAGES
from proxy.app import create_app
from proxy.config import load
from tests import hermes
from tests.flows import Harness

CC = b'"cache_control":{"type":"ephemeral"}'
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


def _harness(**provider_cache: Any) -> Harness:
    return Harness(config=load(None, env={}, overrides={f"provider_cache.{k}": v for k, v in provider_cache.items()}))


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


def test_breakpoints_through_the_flow_bytes_outside_them_as_sent() -> None:
    h = _harness(anthropic_breakpoints="auto")
    raw = (
        b'{"model":"claude-x","max_tokens":16,"system":"Be brief.  ","tools":[{"name":"ls","input_schema":'
        b'{"type":"object","x":1.50}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant",'
        b'"content":[{"type":"text","text":"hello"}]},{"role":"user","content":"more"}]}'
    )
    out = h.send(raw, exchange=MESSAGES)
    assert out.raw == raw.replace(b"1.50}}", b"1.50}," + CC + b"}").replace(
        b'"text":"hello"}', b'"text":"hello",' + CC + b"}"
    )
    own = raw.replace(b'"text":"hello"}', b'"text":"hello","cache_control":{"type":"ephemeral","ttl":"1h"}}')
    assert h.send(own, exchange=MESSAGES).raw == own
    assert Harness().send(raw, exchange=MESSAGES).raw == raw


# -- dollars and verdicts, in-process with a fake upstream ---------------------------------


class Upstream:
    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self.answers.pop(0))


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
    assert _metric(text, 'prefixpin_saved_usd_total{model="claude-x"}') == pytest.approx(1000 * 2.7 / 1e6)
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
    assert sent["system"] == "You are helpful."  # the parent's, as recorded (its breakpoint was on the tools)
    assert [t["name"] for t in sent["tools"]] == ["memory", "terminal"]
    assert sent["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert fork.raw.count(b"cache_control") == 2
