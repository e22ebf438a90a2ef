"""provider_cache end to end: the real openai and anthropic SDKs (and raw bytes)
through ``prefixpin serve`` to a scripted provider cache (``tests/infra/provider.py``,
also the capture upstream: what it received, byte for byte), with and without the
feature on the same trace; breakpoints and their TTL, retention on chat and
Responses, diagnostics on a lineage's second turn, the provider's own verdicts,
saved dollars with write costs; the same through ``upstream.kind: litellm``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from benchmarks import bench_provider
from benchmarks.traces import SMOKE
from tests import hermes
from tests.conftest import Recorder, track
from tests.infra.procs import Proc, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def provider(log_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc(f"provider-{port}", [sys.executable, "-m", "tests.infra.provider", "--port", str(port)], log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")
    yield base
    proc.stop()


def test_hit_ratio_with_and_without_on_the_same_trace(tmp_path: Path) -> None:
    rows = bench_provider.run(SMOKE, 4, tmp_path)
    ratio = {(r["trace"], r["api"], r["route"]): r["ratio"] for r in rows}
    for trace in ("pre-fix", "ideal"):
        assert ratio[(trace, "chat", "prefixpin, lineage key")] > ratio[(trace, "chat", "prefixpin, off")] + 0.2
        assert ratio[(trace, "messages", "prefixpin, off")] == 0.0
        assert ratio[(trace, "messages", "prefixpin, breakpoints")] > 0.5
    assert ratio[("pre-fix", "chat", "prefixpin, off")] > ratio[("pre-fix", "chat", "direct")]


def _metric(base: str, sample: str) -> float:
    text = httpx.get(base + "/metrics", trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


def _post(base: str, path: str, raw: bytes, **headers: str) -> dict[str, Any]:
    r = httpx.post(base + path, content=raw, headers=headers, trust_env=False, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


CC = b'"cache_control":{"type":"ephemeral"}'
CC_1H = b'"cache_control":{"type":"ephemeral","ttl":"1h"}'
PRICE = {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}
SYSTEM = json.dumps("You are a careful assistant. " * 40).encode()  # no rule changes it
TURN1 = (
    b'{"model":"claude-bench","max_tokens":8,"system":' + SYSTEM + b","
    b'"tools":[{"name":"ls","description":"List files.","input_schema":{"type":"object","x":1.50}}],'
    b'"messages":[{"role":"user","content":"List the files."}]}'
)


def _next(raw: bytes, user: str) -> bytes:
    """``raw`` with the reply ``ok`` and another user message."""
    turn = b',{"role":"assistant","content":[{"type":"text","text":"ok"}]},{"role":"user","content":"%s"}]}'
    return raw[:-2] + turn % user.encode()


TURN2 = _next(TURN1, "More.")


def _with_breakpoints(raw: bytes, first: bytes) -> bytes:
    system = raw[raw.index(b'"system":') + 9 : raw.index(b',"tools"')]
    out = raw.replace(system, b'[{"type":"text","text":' + system + b"," + first + b"}]", 1)
    return out.replace(b'"text":"ok"}', b'"text":"ok",' + CC + b"}")


def _saved(usage: dict[str, Any]) -> float:
    """What prefixpin_saved_usd_total adds for one Anthropic usage at PRICE."""
    long = usage["cache_creation"]["ephemeral_1h_input_tokens"]
    short = usage["cache_creation_input_tokens"] - long
    return (usage["cache_read_input_tokens"] * 2.7 - short * 0.75 - long * 3) / 1e6


@pytest.mark.parametrize("ttl", ["1h", "5m"])
def test_breakpoints_their_ttl_and_saved_dollars_with_write_costs(
    ttl: str, provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    cfg = {"anthropic_breakpoints": "auto", "anthropic_ttl": ttl, "prices": {"claude-bench": PRICE}}
    proxy = serve(provider, write_config({"provider_cache": cfg}))
    capture = Recorder(provider)
    track(capture.http)
    first = CC_1H if ttl == "1h" else CC
    u1 = _post(proxy, "/v1/messages", TURN1, **{"x-api-key": "sk-ant-ttl"})["usage"]
    # The lineage's first request only writes: it saved less than nothing so far.
    assert _saved(u1) < 0
    assert _metric(proxy, 'prefixpin_saved_usd_total{model="claude-bench"}') == pytest.approx(_saved(u1))
    u2 = _post(proxy, "/v1/messages", TURN2, **{"x-api-key": "sk-ant-ttl"})["usage"]
    sent = capture.bodies("/v1/messages")
    # The end of system+tools (the system, after the tools in Anthropic's order) with the
    # TTL; the reply's breakpoint after it at 5 minutes; every other byte as sent.
    assert sent[0] == _with_breakpoints(TURN1, first)
    assert sent[1] == _with_breakpoints(TURN2, first)
    assert sent[1].count(b"cache_control") == 2 and sent[1].index(first) < sent[1].rindex(CC)
    written_1h = u1["cache_creation"]["ephemeral_1h_input_tokens"]
    assert (written_1h > 0) == (ttl == "1h") and u2["cache_read_input_tokens"] > 0
    saved = _metric(proxy, 'prefixpin_saved_usd_total{model="claude-bench"}')
    assert saved == pytest.approx(_saved(u1) + _saved(u2))
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    assert "# TYPE prefixpin_saved_usd_total gauge" in text  # it may go down


def test_retention_on_chat_and_responses_unless_the_client_chose(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    keyed = {"prompt_cache_key": "lineage"}
    on = serve(provider, write_config({"provider_cache": {**keyed, "openai_retention": "24h"}}))
    off = serve(provider, write_config({"provider_cache": keyed}))
    capture = Recorder(provider)
    track(capture.http)
    chat = b'{"model":"gpt-bench" ,"messages":[{"role":"system","content":"' + b"Be brief. " * 300 + b'"},'
    first = chat + b'{"role":"user","content":"hi"}],"temperature":0.50}'
    more = b'{"role":"assistant","content":"ok"},{"role":"user","content":"more"}'
    second = chat + b'{"role":"user","content":"hi"},' + more + b'],"temperature":0.50}'
    cached = {}
    for name, proxy in (("24h", on), ("off", off)):
        capture.reset()
        _post(proxy, "/v1/chat/completions", first, authorization="Bearer sk-ret")
        httpx.post(provider + "/_clock", json={"advance": 1200}, trust_env=False)  # a person away for 20 minutes
        usage = _post(proxy, "/v1/chat/completions", second, authorization="Bearer sk-ret")["usage"]
        cached[name] = usage["prompt_tokens_details"]["cached_tokens"]
        sent = capture.bodies("/v1/chat/completions")[-1]
        key = json.loads(sent)["prompt_cache_key"]
        tail = b',"prompt_cache_key":' + json.dumps(key).encode()
        tail += b',"prompt_cache_retention":"24h"}' if name == "24h" else b"}"
        assert sent == second[:-1] + tail
    assert cached["24h"] > 0 and cached["off"] == 0  # the in-memory cache expired meanwhile
    # A client's own choice is kept; none is added next to prompt_cache_options.
    own = first[:-1] + b',"prompt_cache_retention":"in_memory"}'
    options = first[:-1] + b',"prompt_cache_options":{"mode":"implicit"}}'
    for raw in (own, options):
        _post(on, "/v1/chat/completions", raw, authorization="Bearer sk-ret")
        assert capture.bodies("/v1/chat/completions")[-1].startswith(raw[:-1] + b',"prompt_cache_key":')
        assert capture.bodies("/v1/chat/completions")[-1].count(b"prompt_cache_retention") == raw.count(
            b"prompt_cache_retention"
        )
    both = options[:-1] + b',"prompt_cache_retention":"24h"}'
    assert httpx.post(provider + "/v1/chat/completions", content=both, trust_env=False).status_code == 400
    # Responses.
    responses = b'{"model":"gpt-bench","input":[{"role":"user","content":"hi"}],"max_output_tokens":1e3}'
    reply = _post(on, "/v1/responses", responses, authorization="Bearer sk-ret")
    sent = capture.bodies("/v1/responses")[-1]
    assert sent.startswith(responses[:-1] + b',"prompt_cache_key":') and sent.endswith(
        b',"prompt_cache_retention":"24h"}'
    )
    assert reply["usage"]["input_tokens"] > 0
    mine = responses[:-1] + b',"prompt_cache_retention":"in_memory","prompt_cache_key":"mine"}'
    _post(on, "/v1/responses", mine, authorization="Bearer sk-ret")
    assert capture.bodies("/v1/responses")[-1] == mine


def test_diagnostics_on_a_lineages_second_turn(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(provider, write_config({"provider_cache": {"diagnostics": "auto"}}))
    capture = Recorder(provider)
    track(capture.http)
    key = {"x-api-key": "sk-ant-diag"}
    first = _post(proxy, "/v1/messages", TURN1, **key)
    assert "diagnostics" not in first  # nothing to compare with: nothing asked
    second = _post(proxy, "/v1/messages", TURN2, **key)
    got = capture.requests()
    assert got[0]["body"] == TURN1 and "anthropic-beta" not in got[0]["headers"]
    named = b',"diagnostics":{"previous_message_id":"' + first["id"].encode() + b'"}}'
    assert got[1]["body"] == TURN2[:-1] + named
    assert got[1]["headers"]["anthropic-beta"] == "cache-diagnosis-2026-04-07"
    assert second["diagnostics"] == {"cache_miss_reason": None}  # it only extended the previous
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="yes"}') == 1
    # A third turn under another model: both sides name model_changed.
    third = _next(TURN2, "And?")
    reply = _post(proxy, "/v1/messages", third.replace(b"claude-bench", b"claude-other"), **key)
    assert reply["diagnostics"] == {"cache_miss_reason": {"type": "model_changed"}}
    assert capture.requests()[-1]["body"].endswith(b'"previous_message_id":"' + second["id"].encode() + b'"}}')
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="yes"}') == 2
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="no"}') == 0
    # The client's own beta header is kept, ours added to it; its own diagnostics win.
    other = {"x-api-key": "sk-ant-diag2", "anthropic-beta": "files-api-2025-04-14"}
    earlier = _post(proxy, "/v1/messages", TURN1, **other)
    _post(proxy, "/v1/messages", TURN2, **other)
    assert capture.requests()[-1]["headers"]["anthropic-beta"] == "files-api-2025-04-14,cache-diagnosis-2026-04-07"
    assert capture.requests()[-1]["body"].endswith(earlier["id"].encode() + b'"}}')
    mine = TURN2[:-1] + b',"diagnostics":{"previous_message_id":"msg_mine"}}'
    own = {**other, "anthropic-beta": "cache-diagnosis-2026-04-07"}
    _post(proxy, "/v1/messages", mine, **own)
    assert capture.requests()[-1]["body"] == mine


def test_verdicts_against_the_providers_diagnostics(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(provider, write_config({"provider_cache": {"anthropic_breakpoints": "auto"}}))
    client = track(anthropic.Anthropic(base_url=proxy, api_key="sk-ant-verdicts", max_retries=0, timeout=30))
    system, model = hermes.system_prompt(), "claude-bench"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    previous: str | None = None
    reasons = []
    for turn in range(4):
        if turn == 3:
            model = "claude-other"  # both sides see model_changed
        reply = client.messages.create(
            model=model,
            max_tokens=8,
            system=system,
            messages=messages,
            extra_body={"diagnostics": {"previous_message_id": previous}},
            extra_headers={"anthropic-beta": "cache-diagnosis-2026-04-07"},
        )
        reason = (reply.model_dump().get("diagnostics") or {}).get("cache_miss_reason")
        reasons.append(reason and reason["type"])  # the SDK knows the shape
        previous = reply.id
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"turn {turn}"}]
    assert reasons == ["previous_message_not_found", None, None, "model_changed"]
    assert reply.usage.cache_read_input_tokens  # the breakpoints were there
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="yes"}') == 3
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="no"}') == 0


def test_breakpoints_through_litellm(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    pytest.importorskip("litellm", reason="the litellm extra is not installed")
    both = {
        "anthropic_breakpoints": "auto",
        "anthropic_ttl": "1h",
        "prompt_cache_key": "lineage",
        "openai_retention": "24h",
    }
    config = {"upstream": {"kind": "litellm"}, "provider_cache": both}
    proxy = serve(recorder.base, write_config(config))
    # Chat completions for an anthropic/ model: LiteLLM sends Messages with the breakpoints.
    client = track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-litellm-pc", max_retries=0, timeout=120))
    messages = [
        {"role": "system", "content": hermes.system_prompt()},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "README.md and setup.py."},
        {"role": "user", "content": "And the tests?"},
    ]
    client.chat.completions.create(
        model="anthropic/claude-3-5-sonnet-20241022", max_tokens=8, tools=hermes.tools_full(), messages=messages
    )
    sent = json.loads(recorder.bodies("/v1/messages")[-1])
    # OpenAI's cache params stay away from Anthropic (LiteLLM: not among its params).
    assert "prompt_cache_key" not in sent and "prompt_cache_retention" not in sent
    ephemeral = {"type": "ephemeral"}
    # The end of system+tools is the system block (after the tools), with its TTL.
    assert sent["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert "cache_control" not in sent["tools"][-1]
    assert [b.get("cache_control") for b in sent["messages"][1]["content"]] == [ephemeral]
    assert json.dumps(sent).count("cache_control") == 2
    # /v1/messages is forwarded by the passthrough, breakpoints added byte for byte.
    raw = (
        b'{"model":"claude-3-5-sonnet-20241022","max_tokens":8,"system":"Be brief.",'
        b'"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"hello"}]},'
        b'{"role":"user","content":"more"}]}'
    )
    r = httpx.post(proxy + "/v1/messages", content=raw, headers={"x-api-key": "sk-litellm-pc"}, trust_env=False)
    assert r.status_code == 200
    cc = b',"cache_control":{"type":"ephemeral"}'
    assert recorder.bodies("/v1/messages")[-1] == raw.replace(
        b'"Be brief."', b'[{"type":"text","text":"Be brief.",' + CC_1H + b"}]"
    ).replace(b'"text":"hello"}', b'"text":"hello"' + cc + b"}")
    # An OpenAI model through LiteLLM gets the key and the retention (as extra_body: LiteLLM
    # 1.86 drops them as keyword arguments).
    openai_proxy = serve(recorder.base + "/v1", write_config(config))
    oclient = track(openai.OpenAI(base_url=openai_proxy + "/v1", api_key="sk-litellm-pc", max_retries=0, timeout=120))
    oclient.chat.completions.create(model="openai/gpt-4o", max_tokens=8, messages=messages)
    forwarded = json.loads(recorder.bodies("/v1/chat/completions")[-1])
    assert forwarded["prompt_cache_retention"] == "24h" and forwarded["prompt_cache_key"].startswith("pp-")
