"""Lineage, pins and forks end to end (issue tests A-G).

Byte equality is checked on what the recording upstream received; cache hits are
checked with token counts from the real llama-server.  Clients are the openai SDK.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests import hermes
from tests.conftest import Recorder, track
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

USER1 = {"role": "user", "content": "List the files in the repo, please."}
FORK_SID = "20260513_204511_9e319e"


def _client(base: str, key: str = "sk-tenant-1") -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120))


def _system_sent(body: bytes) -> str:
    return str(orjson.loads(body)["messages"][0]["content"])


def _tools_sent(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body).get("tools"))


def _create(
    client: openai.OpenAI, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any
) -> Any:
    extra = {"tools": tools} if tools is not None else {}
    return client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=4, **extra, **kw
    )


def _reply(raw: Any) -> dict[str, Any]:
    """The assistant message as an agent replays it."""
    msg = raw.parse().choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [tc.model_dump() for tc in msg.tool_calls]
    return out


def _sys(**kw: Any) -> dict[str, Any]:
    return {"role": "system", "content": hermes.system_prompt(**kw)}


def _fork_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        _sys(minute="02:31 PM", session=FORK_SID, skills=hermes.SKILLS_REVIEW),
        *history,
        {"role": "user", "content": hermes.REVIEW_PROMPT},
    ]


# -- A ----------------------------------------------------------------------------------
def test_a_minute_change_is_pinned(serve: Callable[..., str], recorder: Recorder, llama_server: str) -> None:
    for upstream in (recorder.base, llama_server):
        proxy = serve(upstream)
        client = _client(proxy)
        t1 = _create(client, [_sys(minute="02:30 PM"), USER1], hermes.tools_full())
        history = [USER1, _reply(t1), {"role": "user", "content": "And now the tests?"}]
        t2 = _create(client, [_sys(minute="02:31 PM"), *history], hermes.tools_full())
        assert t2.headers["x-prefixpin-role"] == "continuation"
        if upstream == recorder.base:
            first, second = recorder.bodies()
            assert _system_sent(first) == _system_sent(second)
            assert "02:30 PM" in _system_sent(second)
            assert _tools_sent(first) == _tools_sent(second)
        else:
            u1, u2 = t1.parse().usage, t2.parse().usage
            # Turn 1's whole prompt (system, tools, history) is a prefix of turn 2's.
            assert u2.prompt_tokens_details.cached_tokens >= u1.prompt_tokens - 1, (u1, u2)


# -- B ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_b_legacy_review_fork(serve: Callable[..., str], recorder: Recorder, stream: bool) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    parent = _create(client, [_sys(), USER1], hermes.tools_full())
    history = [USER1, _reply(parent)]
    recorder.control(
        tool_calls=[
            {"name": "terminal", "arguments": '{"command": "rm -rf /"}'},
            {"name": "memory", "arguments": '{"action": "add", "content": "likes ruff"}'},
        ]
    )
    kw: dict[str, Any] = {"tools": hermes.tools_review()}
    if not stream:
        fork = client.chat.completions.with_raw_response.create(model="tiny", messages=_fork_messages(history), **kw)
        assert fork.headers["x-prefixpin-role"] == "fork"
        msg = fork.parse().choices[0]
        calls = [(tc.function.name, tc.function.arguments) for tc in msg.message.tool_calls]
        finish = msg.finish_reason
    else:
        with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=_fork_messages(history), stream=True, **kw
        ) as resp:
            assert resp.headers["x-prefixpin-role"] == "fork"
            parts: dict[int, list[str]] = {}
            names: dict[int, str] = {}
            finish = None
            for chunk in resp.parse():
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    for tc in choice.delta.tool_calls or ():
                        if tc.function and tc.function.name:
                            names[tc.index] = tc.function.name
                        parts.setdefault(tc.index, []).append((tc.function and tc.function.arguments) or "")
            calls = [(names[i], "".join(parts[i])) for i in sorted(parts)]
    assert calls == [("memory", '{"action": "add", "content": "likes ruff"}')]
    assert finish == "tool_calls"
    parent_body, fork_body = recorder.bodies()
    assert _system_sent(fork_body) == _system_sent(parent_body)
    assert _tools_sent(fork_body) == _tools_sent(parent_body)
    assert FORK_SID not in _system_sent(fork_body)
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    assert "prefixpin_blocked_tool_calls_total 1.0" in metrics
    assert 'prefixpin_forks_total{action="repaired"} 1.0' in metrics


def test_b_fork_blocked_everything_finishes_with_stop(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    parent = _create(client, [_sys(), USER1], hermes.tools_full())
    recorder.control(tool_calls=[{"name": "terminal", "arguments": "{}"}])
    fork = _create(client, _fork_messages([USER1, _reply(parent)]), hermes.tools_review())
    choice = fork.parse().choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"


def test_b_fork_hits_parent_cache_on_llama(serve: Callable[..., str], llama_server: str) -> None:
    proxy = serve(llama_server)
    client = _client(proxy)
    parent = _create(client, [_sys(), USER1], hermes.tools_full())
    history = [USER1, _reply(parent)]
    fork = _create(client, _fork_messages(history), hermes.tools_review())
    assert fork.headers["x-prefixpin-role"] == "fork"
    p, f = parent.parse().usage, fork.parse().usage
    assert f.prompt_tokens_details.cached_tokens >= p.prompt_tokens - 1, (p, f)
    # The same fork sent directly misses from the first difference on.
    direct_parent = _create(_client(llama_server), [_sys(), USER1], hermes.tools_full())
    direct = _create(_client(llama_server), _fork_messages([USER1, _reply(direct_parent)]), hermes.tools_review())
    assert direct.parse().usage.prompt_tokens_details.cached_tokens < p.prompt_tokens // 2


# -- C ----------------------------------------------------------------------------------
def test_c_sessions_sharing_first_message_stay_apart(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    sa, sb = "20260513_204511_aaaaaa", "20260514_091500_bbbbbb"
    a1 = _create(client, [_sys(minute="02:30 PM", session=sa), USER1], hermes.tools_full())
    b1 = _create(client, [_sys(minute="03:10 PM", session=sb), USER1], hermes.tools_full())
    assert b1.headers["x-prefixpin-role"] == "root"
    assert b1.headers["x-prefixpin-lineage"] != a1.headers["x-prefixpin-lineage"]
    nxt = {"role": "user", "content": "next"}
    a2 = _create(client, [_sys(minute="02:41 PM", session=sa), USER1, _reply(a1), nxt], hermes.tools_full())
    b2 = _create(client, [_sys(minute="03:22 PM", session=sb), USER1, _reply(b1), nxt], hermes.tools_full())
    assert a2.headers["x-prefixpin-lineage"] == a1.headers["x-prefixpin-lineage"]
    assert b2.headers["x-prefixpin-lineage"] == b1.headers["x-prefixpin-lineage"]
    bodies = [_system_sent(b) for b in recorder.bodies()]
    for text in (bodies[0], bodies[2]):
        assert sa in text and "02:30 PM" in text and sb not in text and "03:10 PM" not in text
    for text in (bodies[1], bodies[3]):
        assert sb in text and "03:10 PM" in text and sa not in text and "02:30 PM" not in text


# -- D ----------------------------------------------------------------------------------
def test_d_tenants_share_nothing(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    one, two = _client(proxy, "sk-tenant-one"), _client(proxy, "sk-tenant-two")
    nxt = {"role": "user", "content": "next"}
    p1 = _create(one, [_sys(minute="02:30 PM"), USER1], hermes.tools_full())
    _create(one, [_sys(minute="02:31 PM"), USER1, _reply(p1), nxt], hermes.tools_full())
    # Tenant two: byte-identical history and Session ID, its own minute.
    q1 = _create(two, [_sys(minute="02:45 PM"), USER1], hermes.tools_full())
    assert q1.headers["x-prefixpin-role"] == "root"
    q2 = _create(two, [_sys(minute="02:46 PM"), USER1, _reply(q1), nxt], hermes.tools_full())
    assert q2.headers["x-prefixpin-lineage"] == q1.headers["x-prefixpin-lineage"]
    # ... and a fork of tenant one's conversation sent by tenant two is not repaired from it.
    f = _create(two, _fork_messages([USER1, _reply(p1)]), hermes.tools_review())
    bodies = [_system_sent(b) for b in recorder.bodies()]
    assert "02:30 PM" in bodies[1]
    assert "02:45 PM" in bodies[2] and "02:45 PM" in bodies[3] and "02:30 PM" not in bodies[3]
    assert f.headers["x-prefixpin-role"] != "fork" or "02:30 PM" not in bodies[4]
    assert "02:30 PM" not in bodies[4]


# -- E ----------------------------------------------------------------------------------
def test_e_genuine_system_change_is_forwarded(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    t1 = _create(client, [_sys(minute="02:30 PM"), USER1], hermes.tools_full())
    new = "NEW INSTRUCTIONS: from now on, answer in French."
    t2 = _create(
        client,
        [_sys(minute="02:50 PM", extra=new), USER1, _reply(t1), {"role": "user", "content": "ok"}],
        hermes.tools_full(),
    )
    assert t2.headers["x-prefixpin-role"] == "continuation"
    sent = _system_sent(recorder.bodies()[1])
    assert new in sent
    assert sent == hermes.system_prompt(minute="02:30 PM", extra=new).replace(" [49% — 1,085/2,200 chars]", "").replace(
        " [12% — 170/1,375 chars]", ""
    )
    # A real change is a prefix break; the minute prefixpin repaired is not.
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    assert 'prefixpin_prefix_breaks_total{cause="system_changed"} 1.0' in metrics


def test_repaired_changes_are_not_breaks(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    history: list[dict[str, Any]] = [USER1]
    for i, minute in enumerate(("02:30 PM", "02:31 PM", "02:32 PM")):
        r = _create(client, [_sys(minute=minute, pct=49 + i), *history], hermes.tools_full())
        history += [_reply(r), {"role": "user", "content": f"turn {i}"}]
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    breaks = [ln for ln in metrics.splitlines() if ln.startswith("prefixpin_prefix_breaks_total{")]
    assert breaks and all(ln.endswith(" 0.0") for ln in breaks), breaks
    assert "prefixpin_predicted_prefix_ratio_count 2.0" in metrics


def test_trusted_tenant_header(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Any]
) -> None:
    trusting = serve(recorder.base, write_config({"tenancy": {"trust_header": True}}))
    plain = serve(recorder.base)
    for proxy, same in ((trusting, True), (plain, False)):
        a = _client(proxy, "sk-one")
        b = _client(proxy, "sk-two")
        t1 = _create(
            a, [_sys(minute="02:30 PM"), USER1], hermes.tools_full(), extra_headers={"x-prefixpin-tenant": "acme"}
        )
        t2 = _create(
            b,
            [_sys(minute="02:31 PM"), USER1, _reply(t1), {"role": "user", "content": "x"}],
            hermes.tools_full(),
            extra_headers={"x-prefixpin-tenant": "acme"},
        )
        assert (t2.headers["x-prefixpin-role"] == "continuation") is same
        assert "x-prefixpin-tenant" not in recorder.requests()[-1]["headers"]


# -- F ----------------------------------------------------------------------------------
def test_f_two_proxies_share_one_redis(serve: Callable[..., str], recorder: Recorder, redis_url: str) -> None:
    env = {"PREFIXPIN_REDIS_URL": redis_url}
    first, second = serve(recorder.base, env=env), serve(recorder.base, env=env)
    parent = _create(_client(first), [_sys(), USER1], hermes.tools_full())
    # No wait: on a shared store (Redis) a turn is recorded before its response's last
    # bytes (proxy.handler, record_first), so the other process finds the parent now.
    fork = _create(_client(second), _fork_messages([USER1, _reply(parent)]), hermes.tools_review())
    assert fork.headers["x-prefixpin-role"] == "fork"
    parent_body, fork_body = recorder.bodies()
    assert _system_sent(fork_body) == _system_sent(parent_body)
    assert _tools_sent(fork_body) == _tools_sent(parent_body)
    keys = httpx.get(second + "/metrics", trust_env=False).text
    assert 'prefixpin_forks_total{action="repaired"} 1.0' in keys


# -- G ----------------------------------------------------------------------------------
def test_g_redis_stopped_and_restarted(
    serve: Callable[..., str], recorder: Recorder, redis_proc: Callable[..., Any]
) -> None:
    proc, url = redis_proc()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    proxy = serve(recorder.base, env={"PREFIXPIN_REDIS_URL": url})
    client = _client(proxy)
    history: list[dict[str, Any]] = [USER1]
    roles = []

    def turn(minute: str) -> str:
        r = _create(client, [_sys(minute=minute), *history], hermes.tools_full())
        roles.append(r.headers["x-prefixpin-role"])
        history.extend([_reply(r), {"role": "user", "content": f"turn {len(roles)}"}])
        return roles[-1]

    turn("02:30 PM")
    turn("02:31 PM")
    proc.stop()
    for m in range(32, 36):
        turn(f"02:{m} PM")
    assert roles[:2] == ["root", "continuation"]
    assert set(roles[2:]) == {"fail-open"}
    assert httpx.get(proxy + "/readyz", trust_env=False).status_code == 503
    redis_proc(port)  # back, empty, on the same port, without restarting prefixpin
    wait_until(
        lambda: turn("02:40 PM") != "fail-open",
        timeout=15,
        interval=0.3,
        message="a turn that Redis, back, serves (not fail-open)",
    )
    turn("02:41 PM")
    assert roles[-2] == "root" and roles[-1] == "continuation", roles
    assert len(recorder.bodies()) == len(roles), "no request was lost"
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith('prefixpin_fail_open_total{stage="store"}'))
    assert float(line.split()[-1]) >= 4
    assert httpx.get(proxy + "/readyz", trust_env=False).status_code == 200


# -- Anthropic --------------------------------------------------------------------------
def test_anthropic_messages_route(serve: Callable[..., str], recorder: Recorder) -> None:
    import anthropic

    proxy = serve(recorder.base)
    client = track(anthropic.Anthropic(base_url=proxy, api_key="sk-ant-test", max_retries=0))
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in hermes.tools_full()
    ]
    review = [t for t in tools if t["name"] in hermes.REVIEW_TOOL_NAMES]
    user = {"role": "user", "content": "List the files."}
    parent = client.messages.with_raw_response.create(
        model="claude", max_tokens=16, system=hermes.system_prompt(), messages=[user], tools=tools
    )
    assert parent.headers["x-prefixpin-role"] == "root"
    assert parent.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
    reply = {"role": "assistant", "content": [b.model_dump() for b in parent.parse().content]}
    recorder.control(
        tool_calls=[{"name": "terminal", "arguments": "{}"}, {"name": "memory", "arguments": '{"action": "add"}'}]
    )
    fork_messages = [user, reply, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    fork_system = hermes.system_prompt(minute="02:31 PM", session=FORK_SID, skills=hermes.SKILLS_REVIEW)
    fork = client.messages.with_raw_response.create(
        model="claude", max_tokens=16, system=fork_system, messages=fork_messages, tools=review
    )
    assert fork.headers["x-prefixpin-role"] == "fork"
    assert [b.name for b in fork.parse().content if b.type == "tool_use"] == ["memory"]
    with client.messages.stream(
        model="claude", max_tokens=16, system=fork_system, messages=fork_messages, tools=review
    ) as s:
        final = s.get_final_message()
    assert [b.name for b in final.content if b.type == "tool_use"] == ["memory"]
    bodies = [json.loads(b) for b in recorder.bodies("/v1/messages")]
    assert bodies[1]["system"] == bodies[0]["system"] == bodies[2]["system"]
    assert bodies[1]["tools"] == bodies[0]["tools"]
    assert "chars]" not in bodies[0]["system"]
    usage = client.messages.create(model="claude", max_tokens=4, system="x", messages=[user]).usage
    assert usage.cache_read_input_tokens == 0
    assert copy.deepcopy(user) == user
