"""``upstream.kind: litellm``: provider translation as a transport.

Chat completions are handed to ``litellm.acompletion`` (model names route to
providers the LiteLLM way: ``anthropic/…``, ``openai/…``, ``hosted_vllm/…``), with
``upstream.url`` as the API base and the client's own key; the answer comes back as
an OpenAI chat completion (or its SSE stream), so everything prefixpin does on
the way back (usage, the fork tool guard, recording) works unchanged.  Every other
path is forwarded to ``upstream.url`` as with ``kind: openai``.

LiteLLM's own HTTP clients know nothing of ``upstream.tls`` and ``upstream.proxy``,
so each call is handed one (``client=``) whose bytes go out through ``base``, the
transport ``kind: openai`` uses: the same TLS context (CA, ``verify: false``, client
certificate), egress proxy and ``NO_PROXY``, connection cap, and errors (a TLS or
proxy failure raises UpstreamTLS / UpstreamProxy: a 502 saying what failed, no
secret).  Which client depends on the path LiteLLM 1.86.0 takes for the provider:

- ``openai/…``, ``custom_openai/…``: the openai SDK, so an ``AsyncOpenAI`` on that
  HTTP client (made per call: it carries the caller's key);
- ``anthropic/…``, ``hosted_vllm/…``: LiteLLM's ``AsyncHTTPHandler`` on it;
- any other provider: LiteLLM's own clients, which read ``SSL_CERT_FILE``,
  ``HTTPS_PROXY`` and ``NO_PROXY`` from the environment but neither ``upstream.tls``
  nor ``upstream.proxy`` (said at start when those are set).  (LiteLLM's per-call
  ``ssl_verify=`` would not do: an ``ssl.SSLContext`` there fails its calls, "not JSON
  serializable", and a CA path carries no client certificate.)

No LiteLLM global is set for this.

Each request goes out once, as with ``kind: openai``: neither LiteLLM nor the openai
SDK sends it again after a failure or a 429/5xx answer (``max_retries`` 0; a
client's ``max_retries`` or ``num_retries`` in the body is dropped, as are the
other arguments that say where and how LiteLLM connects).  A client that wants a
retry sends the request again.

``prompt_cache_key`` and ``prompt_cache_retention`` go to the providers LiteLLM
says take them (its supported params: OpenAI, OpenRouter, hosted vLLM, DeepSeek,
…; not Anthropic, Mistral, xAI, Gemini) as ``extra_body``: LiteLLM 1.86 counts them
among OpenAI's params yet its ``completion()`` has no argument for them, so passed
as keywords they are dropped for every provider.  ``prompt_cache_options`` (GPT-5.6
and later), which LiteLLM 1.86 does not know, goes where ``prompt_cache_retention``
goes: passed as a keyword it would reach the provider's body even where the API
has no such member (Anthropic's Messages, as LiteLLM builds them).  The
``prompt_cache_breakpoint`` of a content part is carried over as it is to the
OpenAI-shaped providers (``openai/…``, ``hosted_vllm/…``, ``xai/…``), and dropped
for the others (their parts are translated, or flattened to a string).

LiteLLM is imported lazily, only here: it is an optional, exact-pinned dependency
(``requirements-dev.lock`` / the ``litellm`` extra), and it fetches its model cost
map from the internet at import unless told not to.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from proxy.config import Config, Tls
from proxy.errors import UpstreamError, UpstreamStreamCut, UpstreamTLS
from proxy.redact import scrub
from proxy.upstream import tls as tls_
from proxy.upstream.connections import origin_of
from proxy.upstream.message import Body, Bytes, Request, Response, Timeouts, Transport

# Which client a provider's chat path takes as ``client=`` in LiteLLM 1.86.0 (main.completion):
# the openai SDK's, or LiteLLM's AsyncHTTPHandler.  Handing either to the other path breaks it.
_OPENAI_SDK = frozenset({"openai", "custom_openai"})
_HANDLER = frozenset({"anthropic", "hosted_vllm"})
# acompletion arguments that say where and how LiteLLM connects: prefixpin's, never the body's
# (a client's "base_url" or "ssl_verify": false would otherwise win; its "max_retries" or
# "num_retries" would have the request sent again).
_CONNECTION_ARGS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "timeout",
        "client",
        "ssl_verify",
        "shared_session",
        "max_retries",
        "num_retries",
    }
)

log = logging.getLogger("prefixpin")


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
_CACHE_PARAMS = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options")
# A param LiteLLM 1.86 does not list, and the one whose providers take it too.
_LISTED_AS = {"prompt_cache_options": "prompt_cache_retention"}


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
    return {k: v for k, v in found.items() if _LISTED_AS.get(k, k) in supported}


def _error(status: int, message: str, code: str) -> Response:
    body = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return Response(status, list(_JSON), Bytes(orjson.dumps(body)))


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _failure(exc: BaseException, host: str) -> UpstreamError | None:
    """The transport failure under one of LiteLLM's exceptions (it wraps them, once or
    twice): prefixpin's own error, or a TLS error of LiteLLM's own client; None when
    the exception is not about reaching the upstream."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, UpstreamError):
            return cur
        # ssl's own (aiohttp's certificate error subclasses it without its fields; ssl's is its cause)
        if isinstance(cur, ssl.SSLError) and type(cur).__module__ == "ssl":
            return UpstreamTLS("prefixpin could not connect to the upstream: " + tls_.describe(cur, host))
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


class _Carrier(httpx.AsyncBaseTransport):
    """``base`` (a prefixpin transport) under the httpx client LiteLLM is given."""

    def __init__(self, base: Transport, connect_timeout: float) -> None:
        self.base = base
        self.connect_timeout = connect_timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = origin_of(url.scheme, url.raw_host.decode("ascii"), url.port, url.netloc.decode("ascii"))
        t = request.extensions.get("timeout", {})
        connect = min(t.get("connect") or self.connect_timeout, self.connect_timeout)
        timeouts = Timeouts(connect=connect, read=t.get("read"), pool=t.get("pool"))
        content = await request.aread()
        target = url.raw_path.decode("ascii")
        resp = await self.base.send(
            Request(request.method, origin, target, request.headers.multi_items(), content, timeouts)
        )
        extensions = {"reason_phrase": resp.reason, "http_version": b"HTTP/1.1"}
        return httpx.Response(resp.status, headers=resp.headers, stream=_Pieces(resp.body), extensions=extensions)

    async def aclose(self) -> None:
        """Nothing: ``base`` is the LiteLLMTransport's to close, not LiteLLM's."""


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, body: Body) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self.body:
            yield piece

    async def aclose(self) -> None:
        await self.body.aclose()


class _Stream:
    """LiteLLM's chunks as an OpenAI SSE body."""

    def __init__(self, chunks: Any, host: str) -> None:
        self._chunks = chunks
        self._host = host
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                obj = chunk.model_dump(exclude_none=True, mode="json")
                usage = obj.pop("usage", None)
                if obj.get("choices") or usage is None:
                    yield _sse(obj)
                if usage is not None:
                    # OpenAI's shape: usage rides alone on a final chunk with no choices.
                    yield _sse({**obj, "choices": [], "usage": usage})
        except Exception as exc:  # a body fails only with UpstreamError (proxy.upstream.message)
            failure = _failure(exc, self._host)
            if failure is None:
                raise UpstreamStreamCut(f"litellm: {type(exc).__name__}", detail=scrub(str(exc))) from None
            raise failure from None
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
        from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler
        from openai import AsyncOpenAI

        up = config.upstream
        self.api_base = up.url.rstrip("/")
        self.host = urlsplit(self.api_base).hostname or "the upstream"
        self.timeout = up.timeout_s
        self.base = base
        self._openai = AsyncOpenAI
        self.handler = AsyncHTTPHandler(timeout=up.timeout_s)
        self.http = httpx.AsyncClient(
            transport=_Carrier(base, up.connect_timeout_s),
            timeout=httpx.Timeout(up.timeout_s, connect=up.connect_timeout_s),
            headers=self.handler.client.headers,  # LiteLLM's User-Agent
            follow_redirects=True,  # as LiteLLM's and the openai SDK's clients do
            trust_env=False,  # the proxy is base's choice
        )
        # AsyncHTTPHandler takes no client, but sends every request with .client.  (It
        # builds a fresh default one only to retry an httpx ConnectError or
        # RemoteProtocolError, which base never raises: it raises prefixpin's errors.)
        self.handler.client = self.http
        if up.proxy is not None or up.tls != Tls():
            log.info(
                "upstream.kind: litellm: upstream.tls and upstream.proxy apply to models %s; LiteLLM reaches"
                " other providers with its own clients (SSL_CERT_FILE, HTTPS_PROXY, NO_PROXY from the environment)",
                ", ".join(f"{p}/..." for p in sorted(_OPENAI_SDK | _HANDLER)),
            )

    def _client(self, model: Any, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        """``client=`` for ``model``'s provider when its path is known (see the module's
        docstring), else nothing: LiteLLM's own clients."""
        try:
            provider = self.litellm.get_llm_provider(
                model=model, custom_llm_provider=body.get("custom_llm_provider"), api_base=self.api_base
            )[1]
        except Exception:  # a model LiteLLM cannot place: acompletion says so
            provider = None
        if provider in _OPENAI_SDK:
            # max_retries=0: the SDK would send a POST again after a reset or a 429/5xx (prefixpin sends
            # at most once); LiteLLM sets it again from acompletion's max_retries, also 0 (send)
            client = self._openai(api_key=key, base_url=self.api_base, http_client=self.http, max_retries=0)
            return {"client": client}
        if provider in _HANDLER:
            return {"client": self.handler}
        return {}

    async def send(self, request: Request) -> Response:
        path = request.target.partition("?")[0]
        if request.method != "POST" or not path.endswith("/chat/completions"):
            return await self.base.send(request)
        body = orjson.loads(request.content)
        model = body.pop("model", None)
        messages = body.pop("messages", [])
        for name in _CONNECTION_ARGS.intersection(body):
            del body[name]
        key = _key(request)
        cache = _cache_params(self.litellm, model, body)
        if cache:
            extra = body.get("extra_body")
            body["extra_body"] = {**(extra if isinstance(extra, dict) else {}), **cache}
        try:
            result = await self.litellm.acompletion(
                model=model,
                messages=messages,
                api_base=self.api_base,
                api_key=key,
                timeout=self.timeout,
                max_retries=0,  # LiteLLM sets the openai SDK client's retries to this (else 2): sent once
                **self._client(model, body, key),
                **body,
            )
        except Exception as exc:  # LiteLLM maps provider errors to exceptions with a status
            failure = _failure(exc, self.host)
            if failure is not None:
                raise failure from None
            status = getattr(exc, "status_code", None)
            status = status if isinstance(status, int) and 400 <= status < 600 else 502
            return _error(status, f"litellm: {type(exc).__name__}: {scrub(str(exc))}", "litellm_error")
        if body.get("stream"):
            return Response(200, [(b"content-type", b"text/event-stream")], _Stream(result, self.host))
        return Response(200, list(_JSON), Bytes(result.model_dump_json(exclude_none=True).encode()))

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.base.aclose()
