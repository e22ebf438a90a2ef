"""``upstream.kind: litellm``: provider translation as a transport.

Chat completions are handed to ``litellm.acompletion`` (model names route to
providers the LiteLLM way: ``anthropic/…``, ``openai/…``, ``hosted_vllm/…``), with
``upstream.url`` as the API base and the client's own key; the answer comes back as
an OpenAI chat completion (or its SSE stream), so everything prefixpin does on
the way back (usage, the fork tool guard, recording) works unchanged.  Every other
path is forwarded to ``upstream.url`` as with ``kind: openai``.

``prompt_cache_key`` and ``prompt_cache_retention`` go to the providers LiteLLM
says take them (its supported params: OpenAI, OpenRouter, hosted vLLM, …; not
Anthropic) as ``extra_body``: LiteLLM 1.86 counts them among OpenAI's params yet
its ``completion()`` has no argument for them, so passed as keywords they are
dropped for every provider.

LiteLLM is imported lazily, only here: it is an optional, exact-pinned dependency
(``requirements-dev.lock`` / the ``litellm`` extra), and it fetches its model cost
map from the internet at import unless told not to.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.config import Config
from proxy.redact import scrub
from proxy.upstream.message import Bytes, Request, Response, Transport


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


def _key(request: Request) -> str | None:
    headers = {k.lower(): v for k, v in request.headers}
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


_JSON = [(b"content-type", b"application/json")]
_CACHE_PARAMS = ("prompt_cache_key", "prompt_cache_retention")


def _cache_params(litellm: Any, model: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The cache params taken out of ``body``, those ``model``'s provider takes (module docstring)."""
    found = {k: body.pop(k) for k in _CACHE_PARAMS if k in body}
    if not found or not isinstance(model, str):
        return {}
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
        supported = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or ()
    except Exception:  # a model LiteLLM cannot route: acompletion says so
        return {}
    return {k: v for k, v in found.items() if k in supported}


def _error(status: int, message: str, code: str) -> Response:
    body = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return Response(status, list(_JSON), Bytes(orjson.dumps(body)))


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Stream:
    """LiteLLM's chunks as an OpenAI SSE body."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            obj = chunk.model_dump(exclude_none=True, mode="json")
            usage = obj.pop("usage", None)
            if obj.get("choices") or usage is None:
                yield _sse(obj)
            if usage is not None:
                # OpenAI's shape: usage rides alone on a final chunk with no choices.
                yield _sse({**obj, "choices": [], "usage": usage})
        self._ended = True
        yield b"data: [DONE]\n\n"

    def at_end(self) -> bool:
        return self._ended

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class LiteLLMTransport:
    """Chat completions through ``litellm.acompletion``; everything else through ``base``."""

    def __init__(self, config: Config, base: Transport) -> None:
        self.litellm = _import_litellm()
        self.api_base = config.upstream.url.rstrip("/")
        self.timeout = config.upstream.timeout_s
        self.base = base

    async def send(self, request: Request) -> Response:
        path = request.target.partition("?")[0]
        if request.method != "POST" or not path.endswith("/chat/completions"):
            return await self.base.send(request)
        body = orjson.loads(request.content)
        model = body.pop("model", None)
        messages = body.pop("messages", [])
        cache = _cache_params(self.litellm, model, body)
        if cache:
            extra = body.get("extra_body")
            body["extra_body"] = {**(extra if isinstance(extra, dict) else {}), **cache}
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
            return Response(200, [(b"content-type", b"text/event-stream")], _Stream(result))
        return Response(200, list(_JSON), Bytes(result.model_dump_json(exclude_none=True).encode()))

    async def aclose(self) -> None:
        await self.base.aclose()
