"""``upstream.kind: litellm``: LiteLLM's requests go out through prefixpin's transport
(here a recording stand-in, no network), and its failures come back as prefixpin's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from importlib.util import find_spec
from typing import Any

import pytest

from proxy.config import Config, Upstream
from proxy.errors import UpstreamError, UpstreamProxy, UpstreamReset, UpstreamTLS
from proxy.upstream.connections import origin_of
from proxy.upstream.litellm import LiteLLMTransport  # LiteLLM itself is imported by the transport
from proxy.upstream.message import Bytes, Request, Response
from tests.infra import rawupstream as raw

pytestmark = pytest.mark.skipif(find_spec("litellm") is None, reason="the litellm extra is not installed")
ANTHROPIC = "anthropic/claude-3-5-sonnet-20241022"
MODELS = ["openai/m", "hosted_vllm/m", ANTHROPIC]
ORIGIN = origin_of("https", "up.example", 443, "up.example")
Run = Callable[[Coroutine[Any, Any, Any]], Any]  # the module's event loop, running one coroutine
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "c", "usage": {"input_tokens": 1}}


class _Cut:
    """A body whose first piece arrives, then the upstream fails."""

    def __init__(self, first: bytes, failure: UpstreamError) -> None:
        self.first, self.failure = first, failure

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        raise self.failure

    def at_end(self) -> bool:
        return False

    async def aclose(self) -> None:
        pass


class Recording:
    """prefixpin's transport as LiteLLM meets it: records each request; answers in the
    provider's shape, or fails as told."""

    def __init__(self, fail: UpstreamError | None = None, cut: UpstreamError | None = None, status: int = 200) -> None:
        self.fail, self.cut, self.status = fail, cut, status
        self.sent: list[Request] = []

    async def send(self, request: Request) -> Response:
        self.sent.append(request)
        if self.fail is not None:
            raise self.fail
        if self.status != 200:  # an error in Anthropic's shape, which OpenAI's clients read too
            kind = "rate_limit_error" if self.status == 429 else "api_error"
            error = {"type": "error", "error": {"type": kind, "message": "busy", "code": "busy"}}
            return Response(self.status, [(b"content-type", b"application/json")], Bytes(json.dumps(error).encode()))
        stream = json.loads(request.content).get("stream", False)
        anthropic = request.target.endswith("/messages")
        if stream:
            events = [b"data: " + e + b"\n\n" for e in raw.STREAM_EVENTS]  # OpenAI's shape only
            headers = [(b"content-type", b"text/event-stream")]
            if self.cut is not None:
                return Response(200, headers, _Cut(events[0], self.cut))
            return Response(200, headers, Bytes(b"".join(events)))
        body = (
            json.dumps({**MESSAGE, "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}).encode()
            if anthropic
            else raw.JSON_REPLY
        )
        return Response(200, [(b"content-type", b"application/json")], Bytes(body))

    async def aclose(self) -> None:
        pass


def _transport(base: Recording) -> LiteLLMTransport:
    return LiteLLMTransport(Config(upstream=Upstream(url="https://up.example/v1", kind="litellm")), base)


def _request(body: dict[str, Any]) -> Request:
    headers = [("authorization", "Bearer sk-unit")]
    return Request("POST", ORIGIN, "/v1/chat/completions", headers, json.dumps(body).encode())


async def _send(base: Recording, body: dict[str, Any]) -> bytes:
    transport = _transport(base)
    try:
        return await (await transport.send(_request(body))).read()
    finally:
        await transport.aclose()


async def _drain() -> None:
    from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

    await GLOBAL_LOGGING_WORKER.flush()


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """One event loop for the module: LiteLLM logs each call from a queue bound to the
    loop and drained by a background task; it is drained before the loop closes (a
    coroutine left in it would never be awaited)."""
    with asyncio.Runner() as runner:
        yield runner.run
        runner.run(_drain())


@pytest.mark.parametrize("model", MODELS)
def test_each_client_path_sends_through_prefixpins_transport(run: Run, model: str) -> None:
    base = Recording()
    reply = json.loads(run(_send(base, {"model": model, "messages": [{"role": "user", "content": "hi"}]})))
    assert reply["choices"][0]["message"]["content"] == "ok"
    sent = base.sent[0]
    assert (sent.origin.host, sent.origin.port) == ("up.example", 443)
    assert sent.target == ("/v1/v1/messages" if model == ANTHROPIC else "/v1/chat/completions")
    assert "sk-unit" in dict((k.lower(), v) for k, v in sent.headers).get(
        "x-api-key" if model == ANTHROPIC else "authorization", ""
    )


@pytest.mark.parametrize("model", ["openai/m", "hosted_vllm/m"])
def test_a_stream_through_prefixpins_transport(run: Run, model: str) -> None:
    base = Recording()
    body = run(_send(base, {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}))
    assert b'"content":"ok"' in body and body.endswith(b"data: [DONE]\n\n")
    assert len(base.sent) == 1


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    "failure",
    [
        UpstreamTLS("prefixpin could not connect to the upstream: TLS certificate verification failed for host h"),
        UpstreamProxy("prefixpin could not connect to the egress proxy http://127.0.0.1:9"),
    ],
    ids=["tls", "proxy"],
)
def test_a_transport_failure_comes_back_as_prefixpins_error(run: Run, model: str, failure: UpstreamError) -> None:
    base = Recording(fail=failure)
    with pytest.raises(type(failure)) as caught:
        run(_send(base, {"model": model, "messages": [{"role": "user", "content": "hi"}]}))
    assert caught.value is failure
    assert len(base.sent) == 1  # not sent again (the openai SDK would retry it twice)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("asked", [{}, {"max_retries": 5}, {"num_retries": 3}], ids=["default", "max", "num"])
def test_a_request_the_upstream_refuses_is_sent_once(run: Run, model: str, status: int, asked: dict[str, int]) -> None:
    """A 429 or a 5xx goes back to the client as the provider's status, after one send:
    neither LiteLLM nor the openai SDK retries it, whatever the body asks."""
    base = Recording(status=status)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **asked}

    async def main() -> int:
        transport = _transport(base)
        try:
            resp = await transport.send(_request(body))
            await resp.read()
            return resp.status
        finally:
            await transport.aclose()

    assert run(main()) == status
    assert len(base.sent) == 1


@pytest.mark.parametrize("model", ["openai/m", "hosted_vllm/m"])
def test_a_stream_the_upstream_cuts_fails_with_prefixpins_error(run: Run, model: str) -> None:
    cut = UpstreamReset("the upstream closed the connection")

    async def main() -> list[bytes]:
        transport = _transport(Recording(cut=cut))
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        resp = await transport.send(_request(body))
        pieces = []
        try:
            async for piece in resp.body:
                pieces.append(piece)
        finally:
            await resp.aclose()
            await transport.aclose()
        return pieces

    with pytest.raises(UpstreamReset) as caught:
        run(main())
    assert caught.value is cut


def test_the_body_names_no_other_base_and_no_verification(run: Run) -> None:
    base = Recording()
    body = {
        "model": "hosted_vllm/m",
        "messages": [{"role": "user", "content": "hi"}],
        "base_url": "https://elsewhere.example/v1",
        "api_base": "https://elsewhere.example/v1",
        "ssl_verify": False,
    }
    run(_send(base, body))
    assert [r.origin.host for r in base.sent] == ["up.example"]
