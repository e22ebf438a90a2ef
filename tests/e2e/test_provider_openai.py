"""The providers' caches as they work at the end of 2026, end to end: the real
``prefixpin serve`` in front of the scripted provider (``tests/infra/provider.py``
as OpenAI's GPT-5.6 and later: entries only at breakpoints, cache writes,
diagnostics on Responses), chat completions and Responses, streamed and not, with
the openai SDK and raw bytes; the other providers' usage shapes from the recording
upstream; the same through ``upstream.kind: litellm`` where LiteLLM 1.86 carries it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Recorder, track
from tests.infra.procs import Proc, free_port, start_prefixpin
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

MODEL = "gpt-5.6"
BP = b'"prompt_cache_breakpoint":{"mode":"explicit"}'
SYSTEM = "You are a careful coding agent. Follow the repository's conventions. " * 80  # ~1,400 tokens
PRICE = {"input": 2, "cached_input": 0.2, "cache_write": 2.5, "output": 8}  # writes at 1.25x input


@pytest.fixture
def provider(log_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc(f"provider-{port}", [sys.executable, "-m", "tests.infra.provider", "--port", str(port)], log_dir)
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/health")
    yield base
    proc.stop()


def _samples(base: str, sample: str) -> float:
    text = httpx.get(base + "/metrics", trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


def _metric(base: str, sample: str, expected: float | None = None) -> float:
    """The sum of ``sample``'s series; with ``expected``, once it has reached it (the
    counting hooks run just after the response)."""
    if expected is None:
        return _samples(base, sample)
    wait_until(
        lambda: _samples(base, sample) == pytest.approx(expected), message=lambda: f"{sample}: {_samples(base, sample)}"
    )
    return expected


def _client(base: str, key: str) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60))


def _session(opener: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opener}]


def _cached_by_session(proxy: str, key: str, *, stream: bool) -> list[int]:
    """Three sessions of one agent (its system prompt, different first messages): each first request's cached tokens."""
    client = _client(proxy, key)
    out = []
    for n in range(3):
        messages = _session(f"Task {n}: fix the failing test.")
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
            ) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            usage = chunks[-1]["usage"]
        else:
            usage = client.chat.completions.create(model=MODEL, messages=messages).model_dump()["usage"]
        out.append(usage["prompt_tokens_details"]["cached_tokens"])
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_chat_breakpoints_let_new_sessions_share_the_agents_prefix(
    stream: bool, provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    on = serve(provider, write_config({"provider_cache": {"openai_breakpoints": "auto", "prices": {MODEL: PRICE}}}))
    off = serve(provider, write_config({"provider_cache": {"prices": {MODEL: PRICE}}}))
    # Without a breakpoint of its own, a new session gets only the implicit one at its
    # newest message: the agent's fixed prefix is never shared.
    assert _cached_by_session(off, f"sk-off-{stream}", stream=stream) == [0, 0, 0]
    httpx.post(provider + "/_reset", trust_env=False)
    cached = _cached_by_session(on, f"sk-on-{stream}", stream=stream)
    system_tokens = len(json.dumps({"role": "system", "content": SYSTEM})) // 4
    assert cached[0] == 0 and cached[1] >= system_tokens - 2 and cached[2] == cached[1]
    # Cache writes are counted and priced: the first session wrote more than it read.
    written = _metric(on, f'prefixpin_cache_write_tokens_total{{model="{MODEL}"')
    assert written > 0
    assert _metric(off, f'prefixpin_saved_usd_total{{model="{MODEL}"}}') < 0  # writes only: less than nothing saved


def test_chat_breakpoints_bytes_outside_them_as_sent(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(provider, write_config({"provider_cache": {"openai_breakpoints": "auto", "openai_retention": "24h"}}))
    capture = Recorder(provider)
    track(capture.http)
    system = json.dumps(SYSTEM).encode()
    raw = (
        b'{"model":"gpt-5.6" ,"messages":[{"role":"system","content":' + system + b'},{"role":"user","content":"q1"},'
        b'{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}],"temperature":0.50,"n":1e0}'
    )
    r = httpx.post(
        proxy + "/v1/chat/completions", content=raw, headers={"authorization": "Bearer sk-b"}, trust_env=False
    )
    assert r.status_code == 200, r.text
    sent = capture.bodies("/v1/chat/completions")[-1]
    part = b'[{"type":"text","text":%s,' + BP + b"}]"
    expected = raw.replace(system, part % system, 1).replace(b'"q1"', part % b'"q1"', 1)
    assert sent == expected[:-1] + b',"prompt_cache_retention":"24h"}'  # never prompt_cache_options next to it
    # The client's own breakpoint and options are kept, nothing added.
    own = raw.replace(b'"q2"', part % b'"q2"').replace(b',"n":1e0}', b',"prompt_cache_options":{"mode":"explicit"}}')
    r = httpx.post(
        proxy + "/v1/chat/completions", content=own, headers={"authorization": "Bearer sk-b"}, trust_env=False
    )
    assert r.status_code == 200, r.text
    assert capture.bodies("/v1/chat/completions")[-1] == own


def _replay(response: dict[str, Any]) -> dict[str, Any]:
    """The reply's message item as a client replays it (what the provider answered)."""
    item = response["output"][0]
    content = [{"type": "output_text", "text": part["text"], "annotations": []} for part in item["content"]]
    return {"type": "message", "id": item["id"], "status": "completed", "role": "assistant", "content": content}


def _responses(client: openai.OpenAI, items: list[Any], *, stream: bool, **kw: Any) -> dict[str, Any]:
    """One Responses request; the response as the client got it (a stream's completed response)."""
    if not stream:
        return client.responses.create(model=MODEL, input=items, **kw).model_dump()
    events = list(client.responses.create(model=MODEL, input=items, stream=True, **kw))
    assert events[-1].type == "response.completed"
    return events[-1].response.model_dump()


@pytest.mark.parametrize("stream", [False, True])
def test_responses_breakpoints_and_diagnostics(
    stream: bool, provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    cfg = {"openai_breakpoints": "auto", "diagnostics": "auto"}
    proxy = serve(provider, write_config({"provider_cache": cfg}))
    capture = Recorder(provider)
    track(capture.http)
    client = _client(proxy, f"sk-resp-{stream}")
    developer = {"role": "developer", "content": SYSTEM}
    items: list[Any] = [developer, {"role": "user", "content": "Fix the bug."}]
    first = _responses(client, items, stream=stream)
    sent = json.loads(capture.bodies("/v1/responses")[-1])
    assert "prompt_cache_options" not in sent  # nothing to compare with yet
    assert sent["input"][0]["content"] == [
        {"type": "input_text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]
    # The next turn replays the output: compared with the lineage's previous response.
    items += [_replay(first), {"role": "user", "content": "Thanks."}]
    second = _responses(client, items, stream=stream)
    sent = json.loads(capture.bodies("/v1/responses")[-1])
    assert sent["prompt_cache_options"] == {"comparison_response_id": first["id"]}
    assert sent["input"][1]["content"][-1]["prompt_cache_breakpoint"] == {"mode": "explicit"}
    assert second["prompt_cache_diagnostics"] == {"type": "cache_hit"}
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
    _metric(proxy, 'prefixpin_cache_verdicts_total{agree="yes"}', 1)
    # Another model: both sides name model_changed.
    items += [_replay(second), {"role": "user", "content": "And the docs?"}]
    third = client.responses.create(model="gpt-5.6-sol", input=items).model_dump()
    assert third["prompt_cache_diagnostics"]["reason"] == "model_changed"
    assert json.loads(capture.bodies("/v1/responses")[-1])["prompt_cache_options"] == {
        "comparison_response_id": second["id"]
    }
    _metric(proxy, 'prefixpin_cache_verdicts_total{agree="yes"}', 2)
    assert _metric(proxy, 'prefixpin_cache_verdicts_total{agree="no"}') == 0
    writes = (
        first["usage"]["input_tokens_details"]["cache_write_tokens"]
        + second["usage"]["input_tokens_details"]["cache_write_tokens"]
    )
    writes += third["usage"]["input_tokens_details"]["cache_write_tokens"]
    _metric(proxy, "prefixpin_cache_write_tokens_total{", writes)


def test_below_the_minimum_counted_and_said_once_per_lineage(
    provider: str, log_dir: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    config = write_config({"provider_cache": {"min_tokens": {"tiny-model": 4096}}})
    proc, proxy = start_prefixpin(log_dir, upstream=provider, config=config, name=f"prefixpin-min-{free_port()}")
    try:
        client = _client(proxy, "sk-min")
        messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        for turn in range(3):
            reply = client.chat.completions.create(model=MODEL, messages=messages)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"q{turn}"},
            ]
        long = [{"role": "system", "content": SYSTEM * 2}, {"role": "user", "content": "hi"}]
        client.chat.completions.create(model=MODEL, messages=long)
        # Over OpenAI's 1,024 tokens, under the 4,096 configured for this one.
        client.chat.completions.create(model="tiny-model", messages=long)
        _metric(proxy, f'prefixpin_below_cache_minimum_total{{model="{MODEL}"}}', 3)
        _metric(proxy, 'prefixpin_below_cache_minimum_total{model="tiny-model"}', 1)
        lines = [line for line in proc.log_path.read_text().splitlines() if "below the" in line]
        assert len(lines) == 2, lines  # one per lineage
        assert "INFO" in lines[0] and "1024 tokens 'gpt-5.6'" in lines[0] and "Be brief" not in lines[0]
    finally:
        proc.stop()


SHAPES = {
    "mistral": ({"prompt_tokens": 4200, "completion_tokens": 2, "num_cached_tokens": 3968}, 4200, 3968, 0),
    "deepseek": (
        {
            "prompt_tokens": 1500,
            "completion_tokens": 2,
            "prompt_cache_hit_tokens": 1408,
            "prompt_cache_miss_tokens": 92,
        },
        1500,
        1408,
        0,
    ),
    "xai": ({"prompt_tokens": 125, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 98}}, 125, 98, 0),
    "gemini": (
        {"prompt_tokens": 3469, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 2040}},
        3469,
        2040,
        0,
    ),
    "openai-writes": (
        {
            "prompt_tokens": 9120,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 9088},
        },
        9120,
        0,
        9088,
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_providers_usage_shape_streamed_and_not(
    shape: str, recorder: Recorder, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    usage, prompt, cached, written = SHAPES[shape]
    proxy = serve(recorder.base, write_config({"metrics": {"models": [shape]}}))
    recorder.control(usage=usage)
    client = _client(proxy, f"sk-{shape}")
    for stream in (False, True):
        messages = [{"role": "user", "content": f"hi {stream}"}]
        if stream:
            assert list(client.chat.completions.create(model=shape, messages=messages, stream=True))
        else:
            client.chat.completions.create(model=shape, messages=messages)
    _metric(proxy, f'prefixpin_prompt_tokens_total{{model="{shape}"', 2 * prompt)
    _metric(proxy, f'prefixpin_cached_tokens_total{{model="{shape}"', 2 * cached)
    _metric(proxy, f'prefixpin_cache_write_tokens_total{{model="{shape}"', 2 * written)


def test_through_litellm(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """LiteLLM 1.86 carries an ``openai/…`` request's breakpoints and the client's
    ``prompt_cache_options`` over, and the answer's ``cache_write_tokens`` back (streamed
    and not)."""
    pytest.importorskip("litellm", reason="the litellm extra is not installed")
    cfg = {
        "upstream": {"kind": "litellm"},
        "provider_cache": {"openai_breakpoints": "auto", "prices": {"openai/gpt-5.6": PRICE}},
    }
    proxy = serve(provider + "/v1", write_config(cfg))
    capture = Recorder(provider)
    track(capture.http)
    client = _client(proxy, "sk-litellm-openai")
    writes = 0
    for n, stream in enumerate((False, True, False)):
        messages = _session(f"Task {n}.")
        kw: dict[str, Any] = {"extra_body": {"prompt_cache_options": {"mode": "implicit"}}} if n == 2 else {}
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model="openai/gpt-5.6",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            ) as r:
                usage = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")][-1]["usage"]
        else:
            usage = client.chat.completions.create(model="openai/gpt-5.6", messages=messages, **kw).model_dump()[
                "usage"
            ]
        writes += usage["prompt_tokens_details"]["cache_write_tokens"]
        sent = json.loads(capture.bodies("/v1/chat/completions")[-1])
        assert sent["messages"][0]["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit"}
        if n:
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the sessions share the system
    assert sent["prompt_cache_options"] == {"mode": "implicit"}  # the client's, as extra_body
    _metric(proxy, 'prefixpin_cache_write_tokens_total{model="openai/gpt-5.6"', writes)


def test_through_litellm_to_anthropic_openais_controls_stay_away(
    provider: str, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """An ``anthropic/…`` chat completion through LiteLLM gets no OpenAI breakpoint (LiteLLM
    would drop it; Anthropic has its own), and the client's ``prompt_cache_options``, which
    Anthropic's Messages have no member for, is not passed on."""
    pytest.importorskip("litellm", reason="the litellm extra is not installed")
    cfg = {"upstream": {"kind": "litellm"}, "provider_cache": {"openai_breakpoints": "auto"}}
    proxy = serve(provider, write_config(cfg))
    capture = Recorder(provider)
    track(capture.http)
    client = _client(proxy, "sk-litellm-anthropic")
    messages = [*_session("Task."), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "More."}]
    client.chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        max_tokens=8,
        messages=messages,
        extra_body={"prompt_cache_options": {"mode": "implicit"}},
    )
    sent = capture.bodies("/v1/messages")[-1]
    assert b"prompt_cache_options" not in sent and b"prompt_cache_breakpoint" not in sent
