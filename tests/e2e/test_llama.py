"""prefixpin serve in front of a real llama-server, driven by the openai SDK.

The tiny model's tokenizer is byte-level, so token counts follow byte counts:
the memory counter sits in the middle of the system prompt, and a request sent
directly misses the cache from the counter on, while through prefixpin (counter
stripped) the whole system prompt is served from cache.  The cache test runs on
both setups: one fixed slot without the RAM prompt cache (the shared server), and
llama-server as users start it (its defaults: 4 slots on a unified KV pool and the
RAM prompt cache; a fresh server per test, as its RAM cache remembers every prompt).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from canonicalize.usage import parse_usage
from tests import hermes
from tests.conftest import track
from tests.infra.procs import DEFAULTS, free_port, start_llama

pytestmark = pytest.mark.e2e


def _client(base: str) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key="sk-e2e", max_retries=0, timeout=120))


def _tokens(llama: str, text: str) -> int:
    r = httpx.post(llama + "/tokenize", json={"content": text}, trust_env=False, timeout=30)
    r.raise_for_status()
    return len(r.json()["tokens"])


def _messages(pct: int, minute: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": hermes.system_prompt(pct=pct, minute=minute)},
        {"role": "user", "content": "What is in my memory?"},
    ]


def _cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


def _stream_usage(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    usage = None
    for chunk in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=3, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None
    return usage


@pytest.fixture(params=["fixed", "defaults"])
def cache_llama(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[str]:
    """The shared one-slot server, or a fresh one with llama-server's defaults."""
    if request.param == "fixed":
        yield request.getfixturevalue("llama_server")
        return
    proc, base = start_llama(log_dir, name=f"llama-defaults-{free_port()}", **DEFAULTS)
    yield base
    proc.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_memory_counter_change_hits_cache_only_through_prefixpin(
    cache_llama: str, serve: Callable[..., str], stream: bool
) -> None:
    llama_server = cache_llama
    proxy = serve(llama_server)
    stripped_system = hermes.system_prompt().replace(" [49% — 1,085/2,200 chars]", "")
    system_tokens = _tokens(llama_server, stripped_system)
    counter_at = _tokens(llama_server, hermes.system_prompt().split(" [49%")[0])

    def two_turns(client: openai.OpenAI) -> list[Any]:
        out = []
        for pct in (49, 50):
            msgs = _messages(pct, "02:30 PM")
            if stream:
                out.append(_stream_usage(client, msgs))
            else:
                out.append(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3).usage)
        return out

    direct = two_turns(_client(llama_server))
    assert _cached(direct[1]) < counter_at + 16, "direct: the cache must break at the counter"
    assert _cached(direct[1]) < system_tokens

    through = two_turns(_client(proxy))
    assert _cached(through[1]) >= system_tokens, (through[1], system_tokens)
    assert through[1].prompt_tokens == through[0].prompt_tokens  # byte-identical prompts


def test_streaming_without_usage_gets_no_usage_chunk(llama_server: str, serve: Callable[..., str]) -> None:
    proxy = serve(llama_server)
    client = _client(proxy)
    chunks = list(
        client.chat.completions.create(model="tiny", messages=_messages(49, "02:30 PM"), stream=True, max_tokens=8)
    )
    assert chunks, "the stream must carry chunks"
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks), "the usage-only chunk prefixpin asked for must not reach the client"
    # ... while prefixpin itself counted the usage.
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("prefixpin_prompt_tokens_total{"))
    assert float(line.rsplit(" ", 1)[1]) > 0


def test_response_headers_and_roles(llama_server: str, serve: Callable[..., str]) -> None:
    proxy = serve(llama_server)
    client = _client(proxy)
    first = client.chat.completions.with_raw_response.create(
        model="tiny", messages=_messages(49, "02:30 PM"), max_tokens=3
    )
    assert first.headers["x-prefixpin-role"] == "root"
    assert first.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
    lineage = first.headers["x-prefixpin-lineage"]
    second = client.chat.completions.with_raw_response.create(
        model="tiny", messages=_messages(51, "02:31 PM"), max_tokens=3
    )
    assert second.headers["x-prefixpin-role"] == "continuation"
    assert second.headers["x-prefixpin-lineage"] == lineage
    assert second.headers["x-prefixpin-rewrites"] == "hermes.memory_usage,hermes.conversation_started"
    bypass = client.chat.completions.with_raw_response.create(
        model="tiny", messages=_messages(52, "02:32 PM"), max_tokens=3, extra_headers={"x-prefixpin-bypass": "1"}
    )
    assert bypass.headers["x-prefixpin-role"] == "bypass"
    assert bypass.headers["x-prefixpin-rewrites"] == ""  # present, empty: nothing changed


_CREATED = re.compile(rb'"created":\d+')


def test_other_routes_pass_through(llama_server: str, serve: Callable[..., str]) -> None:
    proxy = serve(llama_server)
    with httpx.Client(trust_env=False, timeout=30) as http:
        for method, path, body in (
            ("GET", "/v1/models", None),
            ("POST", "/tokenize", {"content": "hello  world\n\tindented"}),
            ("POST", "/detokenize", {"tokens": [104, 105]}),
            ("GET", "/slots", None),
            ("GET", "/no/such/route", None),
        ):
            direct = http.request(method, llama_server + path, json=body)
            via = http.request(method, proxy + path, json=body)
            assert via.status_code == direct.status_code, path
            if path != "/slots":  # slot state changes between two calls
                # llama-server stamps /v1/models with the current second: two calls may
                # straddle one.  Everything else must match byte for byte.
                assert _CREATED.sub(b"", via.content) == _CREATED.sub(b"", direct.content), path
        # A streamed completion on a route prefixpin does not rewrite.
        with http.stream(
            "POST", proxy + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True}
        ) as r:
            assert r.status_code == 200
            text = b"".join(r.iter_raw()).decode()
        assert "data: " in text


def test_llama_usage_shapes_from_the_real_server(llama_server: str) -> None:
    """Captured live: llama.cpp reports usage and timings; both parse to the same counts."""
    body = {"model": "tiny", "messages": _messages(49, "02:30 PM"), "max_tokens": 2}
    with httpx.Client(trust_env=False, timeout=60) as http:
        http.post(llama_server + "/v1/chat/completions", json=body).raise_for_status()
        obj = http.post(llama_server + "/v1/chat/completions", json=body).json()
    assert "usage" in obj and "timings" in obj
    from_usage = parse_usage(obj)
    timings_only = {k: v for k, v in obj.items() if k != "usage"}
    from_timings = parse_usage(timings_only)
    assert from_usage is not None and from_timings is not None
    assert from_usage.prompt == obj["usage"]["prompt_tokens"]
    assert from_usage.cached == obj["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert (from_timings.prompt, from_timings.cached) == (from_usage.prompt, from_usage.cached)


def test_back_to_back_streams_never_fail(llama_server: str, serve: Callable[..., str]) -> None:
    """llama-server closes the connection after each stream while advertising
    keep-alive: prefixpin must notice the closed connection before it sends on it
    (it never resends a request that went out), never answer 502."""
    proxy = serve(llama_server)
    client = _client(proxy)
    for i in range(12):
        msgs = [{"role": "user", "content": f"count {i}"}]
        list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, stream=True))
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    metrics = httpx.get(proxy + "/metrics", trust_env=False).text
    assert 'status="502"' not in metrics
