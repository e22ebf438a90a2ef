"""provider_cache end to end: the real openai and anthropic SDKs through
``prefixpin serve`` to a scripted provider cache (``tests/infra/provider.py``),
with and without the feature on the same trace; the provider's own verdicts;
breakpoints through ``upstream.kind: litellm``."""

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
    both = {"anthropic_breakpoints": "auto", "prompt_cache_key": "lineage"}
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
    assert "prompt_cache_key" not in sent  # LiteLLM keeps OpenAI's key away from Anthropic
    ephemeral = {"type": "ephemeral"}
    assert sent["tools"][-1]["cache_control"] == ephemeral
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
        b'"Be brief."', b'[{"type":"text","text":"Be brief."' + cc + b"}]"
    ).replace(b'"text":"hello"}', b'"text":"hello"' + cc + b"}")
