"""``upstream.kind: litellm`` against real upstreams as users reach them: HTTPS with a
private CA (``upstream.tls.ca_file`` or ``SSL_CERT_FILE``), a wrong CA, mutual TLS,
and an egress proxy (Debian's tinyproxy, through ``HTTPS_PROXY`` or
``upstream.proxy``, ``NO_PROXY`` honoured) — each through a real ``prefixpin serve``
and each of LiteLLM's client paths: the openai SDK (``openai/m``), LiteLLM's HTTP
handler for an OpenAI-compatible server (``hosted_vllm/m``) and for Anthropic
(``anthropic/…``), streamed and not.  The model is the request's, so one prefixpin
process serves the three (each start imports LiteLLM: seconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import track
from tests.e2e import test_egress as egress
from tests.infra import rawupstream as raw
from tests.infra.procs import closed_port
from tests.infra.tls import Pair, server_context

pytestmark = [  # only prefixpin imports LiteLLM: an import here would fetch its cost map from the internet
    pytest.mark.e2e,
    pytest.mark.skipif(find_spec("litellm") is None, reason="the litellm extra is not installed"),
]

# test_egress's fixtures: a private CA and its certificates, tinyproxy, prefixpin processes.
pki = egress.pki
proxy = egress.proxy
prefixpin = egress.prefixpin

SECRET = egress.SECRET
ANTHROPIC = "anthropic/claude-3-5-sonnet-20241022"
MODELS = ["openai/m", "hosted_vllm/m", ANTHROPIC]
MESSAGES = [{"role": "user", "content": "hi"}]


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n".encode()


def _anthropic(stream: bool) -> bytes:
    usage = {"input_tokens": 3, "output_tokens": 1}
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "usage": usage}
    if not stream:
        body = {**msg, "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}
        return raw.json_response(json.dumps(body).encode())
    events = b"".join(
        [
            _event("message_start", {"message": {**msg, "content": [], "stop_reason": None}}),
            _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
            _event("content_block_stop", {"index": 0}),
            _event("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
            _event("message_stop", {}),
        ]
    )
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + raw.chunk(events) + b"0\r\n\r\n"


def _answer(conn: raw.Conn) -> None:
    """OpenAI chat completions, or Anthropic Messages on ``/v1/messages``: JSON, or SSE when asked."""
    while (req := conn.read_request()) is not None:
        stream = b'"stream":true' in req.body.replace(b" ", b"")
        if req.target.partition("?")[0].endswith("/messages"):
            conn.send(_anthropic(stream))
        else:
            conn.send(raw.sse_response(raw.STREAM_EVENTS) if stream else raw.json_response())


@pytest.fixture
def https_upstream(pki: dict[str, Pair]) -> Iterator[raw.RawUpstream]:
    up = raw.RawUpstream(_answer, tls=server_context(pki["server"]))
    yield up
    up.close()


@pytest.fixture
def mtls_upstream(pki: dict[str, Pair]) -> Iterator[raw.RawUpstream]:
    up = raw.RawUpstream(_answer, tls=server_context(pki["server"], client_ca=pki["ca"]))
    yield up
    up.close()


def _litellm(**upstream: Any) -> dict[str, Any]:
    return {"upstream": {"kind": "litellm", **upstream}}


def _chat(base: str, model: str, *, stream: bool) -> str:
    client = track(openai.OpenAI(base_url=base + "/v1", api_key="sk-egress", max_retries=0, timeout=60))
    if stream:
        parts = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, stream=True)  # type: ignore[arg-type]
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def _every_path(base: str) -> None:
    """Each model, a JSON answer and a stream: LiteLLM takes a different path for each."""
    for model in MODELS:
        assert _chat(base, model, stream=False) == "ok", model
        assert _chat(base, model, stream=True) == "ok", model


def _where(model: str) -> str:
    return "/v1/messages" if model == ANTHROPIC else "/chat/completions"


def _post(base: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 5}
    return httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}, timeout=60)


def test_a_private_ca_trusted_through_upstream_tls_ca_file(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    base, _ = prefixpin(https_upstream.url, config=_litellm(tls={"ca_file": str(pki["ca"].cert)}))
    _every_path(base)
    assert [r.target for r in https_upstream.requests] == [_where(m) for m in MODELS for _ in range(2)]
    assert all(r.header("authorization") or r.header("x-api-key") for r in https_upstream.requests)


def test_a_private_ca_trusted_through_ssl_cert_file(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    base, _ = prefixpin(https_upstream.url, config=_litellm(), env={"SSL_CERT_FILE": str(pki["ca"].cert)})
    _every_path(base)


def test_a_wrong_ca_is_a_502_that_names_tls_and_no_secret(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    url = https_upstream.url.replace("https://", f"https://alice:{SECRET}@")
    base, proc = prefixpin(url, config=_litellm(tls={"ca_file": str(pki["other"].cert)}))
    for model in MODELS:
        r = _post(base, model)
        assert r.status_code == 502, (model, r.text)
        message = r.json()["error"]["message"]
        assert "TLS certificate verification failed for host localhost" in message, (model, message)
        assert SECRET not in r.text
    metrics = httpx.get(base + "/metrics", timeout=10).text
    assert 'prefixpin_upstream_errors_total{kind="tls"} 3.0' in metrics
    ready = httpx.get(base + "/readyz", timeout=10)
    assert ready.status_code == 503 and "TLS certificate verification failed" in ready.text
    assert SECRET not in metrics + ready.text + proc.log_tail(400)
    assert https_upstream.requests == []


def test_verify_false_reaches_an_untrusted_upstream(https_upstream: raw.RawUpstream, prefixpin: Any) -> None:
    base, _ = prefixpin(https_upstream.url, config=_litellm(tls={"verify": False}))
    for model in MODELS:
        assert _chat(base, model, stream=False) == "ok", model


def test_mutual_tls_with_a_client_certificate(
    mtls_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    tls = {"ca_file": str(pki["ca"].cert), "cert_file": str(pki["client"].cert), "key_file": str(pki["client"].key)}
    base, _ = prefixpin(mtls_upstream.url, config=_litellm(tls=tls))
    _every_path(base)


def test_mutual_tls_without_a_client_certificate_is_a_502_naming_tls(
    mtls_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    base, _ = prefixpin(mtls_upstream.url, config=_litellm(tls={"ca_file": str(pki["ca"].cert)}))
    for model in MODELS:
        r = _post(base, model)
        assert r.status_code == 502 and "TLS" in r.json()["error"]["message"], (model, r.text)
    assert mtls_upstream.requests == []


def test_https_through_tinyproxy_named_by_https_proxy(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], proxy: Any, prefixpin: Any
) -> None:
    tp = proxy()
    env = {"HTTPS_PROXY": tp.url, "SSL_CERT_FILE": str(pki["ca"].cert)}
    base, _ = prefixpin(https_upstream.url, config=_litellm(), env=env)
    _every_path(base)
    assert f"CONNECT localhost:{https_upstream.port}" in tp.log_text()
    assert len(https_upstream.requests) == 6


def test_https_through_upstream_proxy_with_credentials_that_are_never_printed(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], proxy: Any, prefixpin: Any
) -> None:
    tp = proxy(user="relay", password=SECRET)
    config = {**_litellm(proxy=tp.url, tls={"ca_file": str(pki["ca"].cert)}), "log": {"level": "debug"}}
    base, proc = prefixpin(https_upstream.url, config=config)
    _every_path(base)
    assert f"CONNECT localhost:{https_upstream.port}" in tp.log_text()
    assert SECRET not in httpx.get(base + "/metrics", timeout=10).text + proc.log_tail(400)


def test_no_proxy_reaches_the_upstream_directly(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    with closed_port() as port:  # nothing listens there
        env = {
            "HTTPS_PROXY": f"http://127.0.0.1:{port}",
            "NO_PROXY": "example.com,localhost",
            "SSL_CERT_FILE": str(pki["ca"].cert),
        }
        base, _ = prefixpin(https_upstream.url, config=_litellm(), env=env)
        _every_path(base)


def test_a_dead_proxy_is_a_502_naming_it(https_upstream: raw.RawUpstream, prefixpin: Any) -> None:
    with closed_port() as port:  # nothing listens there
        base, proc = prefixpin(https_upstream.url, config=_litellm(proxy=f"http://u:{SECRET}@127.0.0.1:{port}"))
        for model in MODELS:
            r = _post(base, model)
            assert r.status_code == 502, (model, r.text)
            assert f"egress proxy http://127.0.0.1:{port}" in r.json()["error"]["message"], (model, r.text)
            assert SECRET not in r.text
        assert SECRET not in proc.log_tail(400)


def test_the_body_cannot_move_litellm_elsewhere_or_turn_verification_off(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    elsewhere = raw.RawUpstream(_answer)
    try:
        base, _ = prefixpin(https_upstream.url, config=_litellm(tls={"ca_file": str(pki["other"].cert)}))
        body = {"model": "hosted_vllm/m", "messages": MESSAGES, "base_url": elsewhere.url, "ssl_verify": False}
        r = httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}, timeout=60)
        assert r.status_code == 502 and "TLS certificate verification failed" in r.text, r.text
        assert elsewhere.requests == []
    finally:
        elsewhere.close()


def test_other_providers_use_litellms_own_clients(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    """A provider whose path prefixpin does not hand a client (here deepseek/): LiteLLM's
    own client trusts SSL_CERT_FILE, and its certificate failure is a 502 naming TLS."""
    base, _ = prefixpin(https_upstream.url, config=_litellm(), env={"SSL_CERT_FILE": str(pki["ca"].cert)})
    assert _chat(base, "deepseek/m", stream=False) == "ok"
    base, _ = prefixpin(https_upstream.url, config=_litellm(), env={"SSL_CERT_FILE": str(pki["other"].cert)})
    r = _post(base, "deepseek/m")
    assert r.status_code == 502 and "TLS certificate verification failed for host localhost" in r.text, r.text


def _unavailable(conn: raw.Conn) -> None:
    """Every request answered 503 (an Anthropic-shaped error body, which OpenAI's clients read too)."""
    body = json.dumps({"type": "error", "error": {"type": "api_error", "message": "busy"}}).encode()
    while conn.read_request() is not None:
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        conn.send(head.encode() + body)


@pytest.mark.parametrize("script", [_unavailable, raw.reset_after_read], ids=["503", "reset after the request"])
def test_a_request_the_upstream_fails_reaches_it_once(prefixpin: Any, script: Any) -> None:
    """A 503, or a connection reset once the request was read (the upstream may be
    generating): each model's request reaches the upstream once, whatever the body asks
    of LiteLLM's retries, and the client gets the error without a retry (the openai SDK
    logs each one it makes)."""
    up = raw.RawUpstream(script)
    try:
        base, proc = prefixpin(up.url, config=_litellm())
        for model in MODELS:
            before = len(up.requests)
            body = {"model": model, "messages": MESSAGES, "max_tokens": 5, "max_retries": 3, "num_retries": 3}
            r = httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}, timeout=60)
            assert r.status_code >= 500, (model, r.status_code, r.text)
            assert len(up.requests) - before == 1, (model, [q.target for q in up.requests[before:]])
        assert "Retrying request" not in proc.log_tail(400)
    finally:
        up.close()
