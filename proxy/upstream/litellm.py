"""``upstream.kind: litellm``: provider translation as an httpx transport.

Chat completions are handed to ``litellm.acompletion`` (model names route to
providers the LiteLLM way: ``anthropic/…``, ``openai/…``, ``hosted_vllm/…``), with
``upstream.url`` as the API base and the client's own key; the answer comes back as
an OpenAI chat completion (or its SSE stream), so everything prefixpin does on
the way back (usage, the fork tool guard, recording) works unchanged.  Every other
path is forwarded to ``upstream.url`` as with ``kind: openai``.

LiteLLM is imported lazily, only here: it is an optional, exact-pinned dependency
(``requirements-dev.lock`` / the ``litellm`` extra), and it fetches its model cost
map from the internet at import unless told not to.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from proxy.config import Upstream
from proxy.redact import scrub


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch at import
    try:
        import litellm
    except ImportError as exc:
        raise SystemExit(
            "upstream.kind: litellm needs LiteLLM installed (pip install --require-hashes -r requirements-dev.lock,"
            f" or the prefixpin[litellm] extra): {exc}"
        ) from None
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


def _key(request: httpx.Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def _error(status: int, message: str, code: str) -> httpx.Response:
    body = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return httpx.Response(status, content=orjson.dumps(body), headers={"content-type": "application/json"})


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            obj = chunk.model_dump(exclude_none=True, mode="json")
            usage = obj.pop("usage", None)
            if obj.get("choices") or usage is None:
                yield _sse(obj)
            if usage is not None:
                # OpenAI's shape: usage rides alone on a final chunk with no choices.
                yield _sse({**obj, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class LiteLLMTransport(httpx.AsyncBaseTransport):
    def __init__(self, cfg: Upstream, passthrough: httpx.AsyncBaseTransport) -> None:
        self.litellm = _import_litellm()
        self.api_base = cfg.url.rstrip("/")
        self.timeout = cfg.timeout_s
        self.passthrough = passthrough

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return await self.passthrough.handle_async_request(request)
        body = orjson.loads(await request.aread())
        model = body.pop("model", None)
        messages = body.pop("messages", [])
        try:
            result = await self.litellm.acompletion(
                model=model,
                messages=messages,
                api_base=self.api_base,
                api_key=_key(request),
                timeout=self.timeout,
                **body,
            )
        except Exception as exc:  # LiteLLM maps provider errors to exceptions with a status
            status = getattr(exc, "status_code", None)
            status = status if isinstance(status, int) and 400 <= status < 600 else 502
            return _error(status, f"litellm: {type(exc).__name__}: {scrub(str(exc))}", "litellm_error")
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Stream(result))
        return httpx.Response(
            200,
            content=result.model_dump_json(exclude_none=True).encode(),
            headers={"content-type": "application/json"},
        )

    async def aclose(self) -> None:
        await self.passthrough.aclose()
