"""``upstream.kind: litellm``: prefixpin canonicalizes, LiteLLM translates.

Against the real llama-server (OpenAI route through LiteLLM) and against the
recording upstream speaking Anthropic Messages (LiteLLM translates the OpenAI
request to Anthropic and the answer back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import openai
import pytest

from tests import hermes
from tests.conftest import Recorder, track

pytestmark = [  # only prefixpin imports LiteLLM: an import here would fetch its cost map from the internet
    pytest.mark.e2e,
    pytest.mark.skipif(find_spec("litellm") is None, reason="the litellm extra is not installed"),
]


def _client(base: str) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key="sk-litellm-e2e", max_retries=0, timeout=120))


def test_litellm_to_llama_server(
    serve: Callable[..., str], llama_server: str, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(llama_server + "/v1", write_config({"upstream": {"kind": "litellm"}}))
    client = _client(proxy)
    usages = []
    for pct in (49, 50):
        msgs = [{"role": "system", "content": hermes.system_prompt(pct=pct)}, {"role": "user", "content": "hi"}]
        raw = client.chat.completions.with_raw_response.create(model="openai/tiny", messages=msgs, max_tokens=3)
        assert raw.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
        usages.append(raw.parse().usage)
    assert usages[1].prompt_tokens_details.cached_tokens >= usages[1].prompt_tokens - 8
    chunks = list(client.chat.completions.create(model="openai/tiny", messages=msgs, max_tokens=3, stream=True))
    assert chunks and all(c.usage is None for c in chunks)


def test_litellm_translates_to_anthropic(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(recorder.base, write_config({"upstream": {"kind": "litellm"}}))
    client = _client(proxy)
    model = "anthropic/claude-3-5-sonnet-20241022"
    user = {"role": "user", "content": "List the files."}
    parent = client.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=16,
        tools=hermes.tools_full(),
        messages=[{"role": "system", "content": hermes.system_prompt()}, user],
    )
    assert parent.headers["x-prefixpin-role"] == "root"
    reply = parent.parse().choices[0].message
    assert reply.content == "ok"
    sent = json.loads(recorder.bodies("/v1/messages")[0])
    system = sent["system"] if isinstance(sent["system"], str) else "".join(b["text"] for b in sent["system"])
    assert "MEMORY (your personal notes)\n" in system and "chars]" not in system
    assert recorder.requests()[0]["headers"].get("x-api-key") == "sk-litellm-e2e"
    recorder.control(
        tool_calls=[{"name": "terminal", "arguments": "{}"}, {"name": "memory", "arguments": '{"action": "add"}'}]
    )
    fork_system = hermes.system_prompt(minute="02:31 PM", session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW)
    fork = client.chat.completions.with_raw_response.create(
        model=model,
        max_tokens=16,
        tools=hermes.tools_review(),
        messages=[
            {"role": "system", "content": fork_system},
            user,
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": hermes.REVIEW_PROMPT},
        ],
    )
    assert fork.headers["x-prefixpin-role"] == "fork"
    calls = fork.parse().choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["memory"]
    bodies = [json.loads(b) for b in recorder.bodies("/v1/messages")]
    assert bodies[1]["system"] == bodies[0]["system"]
    assert [t["name"] for t in bodies[1]["tools"]] == [t["name"] for t in bodies[0]["tools"]]
