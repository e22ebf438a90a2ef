"""The Responses API against the real ``prefixpin serve`` and the recording
upstream: edits spliced into the client's bytes, the real openai SDK's
``responses.create`` / ``responses.stream`` through prefixpin (lineage, usage,
``previous_response_id``), and the fork guard on a real stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests import hermes
from tests.conftest import Recorder, track

pytestmark = pytest.mark.e2e

KEY = {"authorization": "Bearer sk-resp", "content-type": "application/json"}
PATH = "/v1/responses"
SYSTEM = hermes.system_prompt()
STRIPPED = SYSTEM.replace(" [49% — 1,085/2,200 chars]", "").replace(" [12% — 170/1,375 chars]", "")
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}


def _metric(proxy: str, prefix: str) -> float:
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


def _client(proxy: str) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-resp", max_retries=0))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_edits_are_spliced_into_the_clients_bytes(serve: Callable[..., str], recorder: Recorder, stream: bool) -> None:
    proxy = serve(recorder.base)
    raw = (
        b'{"model": "m", "temperature": 0.50, "x": 1, "x": 2, "instructions": '
        + json.dumps(SYSTEM).encode()
        + b', "input": [{"role": "user", "content": [{"type": "input_text", "text": "caf\\u00e9 \\/"}]}],'
        b' "max_output_tokens": 1e3' + (b', "stream": true}' if stream else b"}")
    )
    with httpx.Client(trust_env=False, timeout=30) as http:
        r = http.post(proxy + PATH, content=raw, headers=KEY)
    assert r.status_code == 200, r.text
    assert r.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
    assert r.headers["x-prefixpin-role"] == "root"
    assert recorder.bodies(PATH) == [raw.replace(json.dumps(SYSTEM).encode(), orjson.dumps(STRIPPED))]
    if stream:
        assert r.text.rstrip().splitlines()[-2] == "event: response.completed"
    else:
        assert r.json()["output"][0]["content"][0]["text"] == "ok"
    assert _metric(proxy, 'prefixpin_prompt_tokens_total{model="m",role="root"}') > 0
    assert _metric(proxy, 'prefixpin_requests_total{role="root",route="responses"') == 1


def test_sdk_create_then_stream_continue_one_lineage(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(recorder.base, write_config({"canonicalize": {"packs": ["generic", "hermes", "codex"]}}))
    client = _client(proxy)
    recorder.control(tool_calls=[{"name": "shell", "arguments": '{"cmd": ["ls"]}'}], cached=7)
    first_input: list[Any] = [{"role": "user", "content": "list the files"}]
    kw: dict[str, Any] = {"model": "m", "instructions": "You are Codex.", "tools": [SHELL], "prompt_cache_key": "th1"}
    raw = client.responses.with_raw_response.create(input=first_input, **kw)
    assert raw.headers["x-prefixpin-role"] == "root"
    one = raw.parse()
    assert [item.type for item in one.output] == ["function_call"]
    call = one.output[0]
    recorder.control(content="two files", cached=50)
    # The next turn replays the output items and adds the call's output (Codex style).
    second_input = [
        *first_input,
        *(item.model_dump(exclude_none=True) for item in one.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.py b.py"},
    ]
    with client.responses.stream(input=second_input, **kw) as stream:
        for _ in stream:
            pass
        two = stream.get_final_response()
    assert two.output_text == "two files"
    # A third turn names the previous response instead of replaying.
    recorder.control(content="done", cached=60)
    three = client.responses.with_raw_response.create(
        input=[{"role": "user", "content": "thanks"}], previous_response_id=two.id, **kw
    )
    assert three.headers["x-prefixpin-role"] == "continuation"
    assert three.headers["x-prefixpin-lineage"] == raw.headers["x-prefixpin-lineage"]
    assert _metric(proxy, 'prefixpin_requests_total{role="continuation",route="responses"') == 2
    assert _metric(proxy, 'prefixpin_cached_tokens_total{model="m",role="continuation"}') == 110
    assert _metric(proxy, 'prefixpin_cached_tokens_total{model="m",role="root"}') == 7
    # Nothing of the history was rewritten: the upstream got what the SDK sent.
    sent = [orjson.loads(b) for b in recorder.bodies(PATH)]
    assert sent[1]["input"] == json.loads(json.dumps(second_input))


def test_fork_guard_on_a_real_stream(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = _client(proxy)
    instructions = "You are a coding agent with a long and stable system prompt. " * 8
    task = [{"role": "user", "content": "fix it"}]
    parent = client.responses.create(model="m", instructions=instructions, tools=[SHELL, SPAWN], input=task)
    replay = [*task, *(item.model_dump(exclude_none=True) for item in parent.output)]
    recorder.control(tool_calls=[{"name": "spawn_agent"}, {"name": "shell", "arguments": "{}"}])
    fork_input = [*replay, {"role": "user", "content": "review it"}]
    with client.responses.stream(model="m", instructions=instructions, tools=[SHELL], input=fork_input) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [("function_call", "shell")]
    fork_sent = orjson.loads(recorder.bodies(PATH)[-1])
    assert [t["name"] for t in fork_sent["tools"]] == ["shell", "spawn_agent"]  # the parent's tools[]
    assert _metric(proxy, "prefixpin_blocked_tool_calls_total") == 1
    assert _metric(proxy, 'prefixpin_forks_total{action="repaired"}') == 1


def test_prefixpins_own_errors_use_the_openai_shape(
    serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    from tests.infra.procs import closed_port

    with closed_port() as port:
        proxy = serve(f"http://127.0.0.1:{port}", write_config({"limits": {"max_body_bytes": 2048}}))
        with httpx.Client(trust_env=False, timeout=30) as http:
            big = http.post(proxy + PATH, content=b'{"x": "' + b"a" * 4096 + b'"}', headers=KEY)
        assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
        client = _client(proxy)
        with pytest.raises(openai.APIStatusError) as info:
            client.responses.create(model="m", input="hi")
    assert info.value.status_code == 502
    assert info.value.code == "upstream_unavailable"  # the SDK read error.code: the OpenAI shape
