"""The app in-process with a fake upstream transport and misbehaving stores:
prefixpin's own failures fail open and are counted, never a 5xx."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson
from starlette.testclient import TestClient

from canonicalize import LineageRecord, Lookup
from proxy.app import create_app
from proxy.config import load
from proxy.errors import StoreError
from proxy.metrics import ModelLabels
from tests import hermes


class Upstream:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read())
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": 10},
            },
        )


class DownStore:
    records_at = "after_last_byte"

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None, **kw: Any) -> Lookup:
        raise StoreError("down")

    async def blobs(self, tenant: str, refs: Sequence[str], owner: str | None = None) -> list[bytes | None]:
        raise StoreError("down")

    async def record(self, *args: Any, **kwargs: Any) -> None:
        raise StoreError("down")

    async def ping(self) -> None:
        raise StoreError("down")

    async def close(self) -> None:
        return None


class CorruptStore(DownStore):
    """Answers with a fork parent whose recorded blobs are not JSON."""

    async def lookup(self, tenant: str, links: Sequence[bytes], declared: str | None, **kw: Any) -> Lookup:
        parent = LineageRecord(id="p", kind="fork", identity=("20260513_204511_d02a5d",), system_ref="s", tools_ref="t")
        return Lookup(len(links), (parent,), None, (len(links),))

    async def blobs(self, tenant: str, refs: Sequence[str], owner: str | None = None) -> list[bytes | None]:
        return [b"{not json", b"[]"]

    async def record(self, *args: Any, **kwargs: Any) -> None:
        return None


def _app(store: Any) -> tuple[TestClient, Upstream]:
    upstream = Upstream()
    app = create_app(load(None, env={}), transport=httpx.MockTransport(upstream), store=store)
    return TestClient(app), upstream


BODY = hermes.request(hermes.system_prompt(), [{"role": "user", "content": "hi"}])


def _metric(client: TestClient, prefix: str) -> float:
    text = client.get("/metrics").text
    return float(next(ln for ln in text.splitlines() if ln.startswith(prefix)).split()[-1])


def test_store_down_forwards_with_static_rules() -> None:
    client, upstream = _app(DownStore())
    with client:
        r = client.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 200
        assert r.headers["x-prefixpin-role"] == "fail-open"
        assert r.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
        assert "chars]" not in orjson.loads(upstream.bodies[0])["messages"][0]["content"]
        assert _metric(client, 'prefixpin_fail_open_total{stage="store"}') == 1
        assert client.get("/readyz").status_code == 503


def test_internal_failure_forwards_request_unchanged() -> None:
    client, upstream = _app(CorruptStore())
    with client:
        raw = orjson.dumps(BODY)
        r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert r.headers["x-prefixpin-role"] == "fail-open"
        assert upstream.bodies == [raw]
        assert _metric(client, 'prefixpin_fail_open_total{stage="canonicalize"}') == 1


def test_model_labels_are_bounded() -> None:
    labels = ModelLabels(named=["gpt-x"], limit=2)
    got = [labels(m, answered=True) for m in ("a", "b", "c", "gpt-x", "a", None)]
    assert got == ["a", "b", "other", "gpt-x", "a", "unknown"]


def test_model_label_slots_go_only_to_answered_models() -> None:
    labels = ModelLabels(named=["gpt-x"], limit=2)
    assert {labels(f"junk-{i}", answered=False) for i in range(10)} == {"other"}
    assert labels("gpt-x", answered=False) == "gpt-x"  # named in the config: always itself
    assert labels("real", answered=True) == "real"
    assert labels("real", answered=False) == "real"  # it has its slot: a later error keeps the label
    assert labels("junk-0", answered=True) == "junk-0"  # answered now: takes the last free slot
    assert labels("late", answered=True) == "other"


def test_metrics_exposition_has_every_spec_name() -> None:
    client, _ = _app(DownStore())
    with client:
        client.post("/v1/chat/completions", json=BODY)
        text = client.get("/metrics").text
    for name in (
        "prefixpin_requests_total",
        "prefixpin_prompt_tokens_total",
        "prefixpin_cached_tokens_total",
        "prefixpin_cache_write_tokens_total",
        "prefixpin_rewrites_total",
        "prefixpin_forks_total",
        "prefixpin_blocked_tool_calls_total",
        "prefixpin_prefix_breaks_total",
        "prefixpin_uncached_tokens_total",
        "prefixpin_fail_open_total",
        "prefixpin_upstream_errors_total",
        "prefixpin_request_duration_seconds",
        "prefixpin_overhead_seconds",
        "prefixpin_upstream_ttft_seconds",
        "prefixpin_predicted_prefix_ratio",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    assert 'prefixpin_requests_total{role="fail-open",route="chat_completions",status="200"} 1.0' in text


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"c"}}]}\n\ndata: [DONE]\n\n'
)


def test_a_reply_machine_failing_mid_stream_passes_every_byte_through(monkeypatch: Any) -> None:
    """The event the splitter was holding back when the state machine failed is sent too."""
    from canonicalize.wire.reply_chat import ChatReply

    calls = {"n": 0}
    real = ChatReply.feed

    def flaky(self: ChatReply, event: Any) -> bytes | None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(self, event)

    monkeypatch.setattr(ChatReply, "feed", flaky)

    class Chunked(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            # Chunks that cut events in the middle: the failure hits with a partial event held back.
            for part in (STREAM[:70], STREAM[70:130], STREAM[130:]):
                yield part

    def chunked(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunked())

    app = create_app(load(None, env={}), transport=httpx.MockTransport(chunked), store=DownStore())
    with TestClient(app) as client:
        body = {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "x"}],
        }
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.content == STREAM
        assert _metric(client, 'prefixpin_fail_open_total{stage="response"}') == 1
