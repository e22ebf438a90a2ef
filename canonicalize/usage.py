"""Prompt / cached / cache-write token counts from every upstream's usage shape.

``Usage.prompt`` is always the *whole* prompt (cached included), whatever the
shape calls it, so ``cached / prompt`` is the hit ratio everywhere:

- OpenAI, vLLM, SGLang, llama.cpp, xAI, Gemini's OpenAI-compatible endpoint:
  ``usage.prompt_tokens`` and ``usage.prompt_tokens_details.cached_tokens``
  (cache writes: OpenAI's (GPT-5.6 and later) and OpenRouter's
  ``prompt_tokens_details.cache_write_tokens``, vLLM's ``created_cache_tokens``);
- llama.cpp ``timings.cache_n`` / ``timings.prompt_n`` when usage is absent;
- Anthropic: ``input_tokens`` *excludes* ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``, so the prompt is their sum (LiteLLM's
  OpenAI-shaped usage carries the same two fields next to a ``prompt_tokens``
  that already includes them); the writes are split by TTL in
  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``
  (LiteLLM: ``prompt_tokens_details.cache_creation_token_details``), the 1-hour
  ones priced higher;
- DeepSeek: ``prompt_cache_hit_tokens`` / ``prompt_cache_miss_tokens``;
- Mistral: ``usage.num_cached_tokens`` (also ``prompt_token_details.cached_tokens``,
  its SDK's spelling, when ``prompt_tokens_details`` is absent);
- Responses API (OpenAI, xAI): ``input_tokens``,
  ``input_tokens_details.cached_tokens`` and (GPT-5.6 and later)
  ``input_tokens_details.cache_write_tokens``, both parts of ``input_tokens``.

The accumulator's ``completion`` is ``completion_tokens`` (OpenAI shapes) or
``output_tokens`` (Anthropic, Responses): what the output tokens cost.

:class:`UsageAccumulator` is fed every event of a stream and reports once: later
values of a field replace earlier ones (Anthropic repeats cumulative counts in
``message_delta``; OpenAI sends one final chunk), so nothing is counted twice.
It also keeps what a provider said about its cache beside the counts: its cache
diagnostics (Anthropic's ``diagnostics``, OpenAI Responses'
``prompt_cache_diagnostics``), and the id of the response (an Anthropic message's,
a Responses response's: the next turn names it in ``diagnostics.previous_message_id``
or ``prompt_cache_options.comparison_response_id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int
    cached: int
    cache_write: int = 0
    cache_write_1h: int = 0  # of cache_write, the tokens written at the 1-hour TTL


def _int(d: Any, *path: str) -> int | None:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    if type(d) is int:  # (the usual count: no bool, no float to convert)
        return d
    if isinstance(d, bool) or not isinstance(d, _NUMBER):
        return None
    return int(d)


_NUMBER = (int, float)  # (a tuple: ``int | float`` would be built again on every call)


# Where each field sits in a usage object, in the order found values are taken (a
# later path of the same field wins).
_PATHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prompt_tokens", ("prompt_tokens",)),
    ("cached_tokens", ("prompt_tokens_details", "cached_tokens")),
    ("cache_write_tokens", ("prompt_tokens_details", "cache_write_tokens")),
    ("cache_write_tokens", ("cache_write_tokens",)),
    ("created_cache_tokens", ("prompt_tokens_details", "created_cache_tokens")),
    ("created_cache_tokens", ("created_cache_tokens",)),
    ("input_tokens", ("input_tokens",)),
    ("cache_read_input_tokens", ("cache_read_input_tokens",)),
    ("cache_creation_input_tokens", ("cache_creation_input_tokens",)),
    ("cache_write_5m", ("cache_creation", "ephemeral_5m_input_tokens")),
    ("cache_write_1h", ("cache_creation", "ephemeral_1h_input_tokens")),
    ("cache_write_1h", ("prompt_tokens_details", "cache_creation_token_details", "ephemeral_1h_input_tokens")),
    ("input_cached_tokens", ("input_tokens_details", "cached_tokens")),
    ("cache_write_tokens", ("input_tokens_details", "cache_write_tokens")),
    ("num_cached_tokens", ("prompt_token_details", "cached_tokens")),
    ("num_cached_tokens", ("num_cached_tokens",)),
    ("prompt_cache_hit_tokens", ("prompt_cache_hit_tokens",)),
    ("prompt_cache_miss_tokens", ("prompt_cache_miss_tokens",)),
    ("completion_tokens", ("completion_tokens",)),
    ("output_tokens", ("output_tokens",)),
)
_BY_FIRST: dict[str, list[tuple[int, str, tuple[str, ...]]]] = {}
for _order, (_name, _path) in enumerate(_PATHS):
    _BY_FIRST.setdefault(_path[0], []).append((_order, _name, _path[1:]))
_FIRSTS = frozenset(_BY_FIRST)


def _fields(obj: dict[str, Any]) -> dict[str, int]:
    """Raw counts found in one response object or stream event, by field."""
    out: dict[str, int] = {}
    usage = obj.get("usage")
    if obj.get("type") == "message_start" and isinstance(obj.get("message"), dict):
        usage = obj["message"].get("usage")
    if obj.get("type") in ("response.completed", "response.incomplete") and isinstance(obj.get("response"), dict):
        usage = obj["response"].get("usage")
    if isinstance(usage, dict):
        # Only the paths whose first member is there (a few, in any one shape), in _PATHS' order.
        found = []
        for first in _FIRSTS.intersection(usage):
            for order, name, rest in _BY_FIRST[first]:
                value = _int(usage[first], *rest)
                if value is not None:
                    found.append((order, name, value))
        found.sort()
        for _, name, value in found:
            out[name] = value
    timings = obj.get("timings")
    if isinstance(timings, dict):
        for name in ("cache_n", "prompt_n"):
            value = _int(timings, name)
            if value is not None:
                out["timings_" + name] = value
    return out


def _resolve(f: dict[str, int]) -> Usage | None:
    write = f.get("cache_write_tokens", f.get("created_cache_tokens", 0))
    anthropic = ("cache_read_input_tokens", "cache_creation_input_tokens", "cache_write_5m")
    if "prompt_tokens" not in f and any(k in f for k in anthropic):
        # Anthropic.  (LiteLLM's OpenAI-shaped usage repeats these two fields next to
        # a ``prompt_tokens`` that already includes them: handled below.)
        read = f.get("cache_read_input_tokens", 0)
        long = f.get("cache_write_1h", 0)
        created = f.get("cache_creation_input_tokens", f.get("cache_write_5m", 0) + long)
        return Usage(f.get("input_tokens", 0) + read + created, read, created, min(long, created))
    if "prompt_cache_hit_tokens" in f:  # DeepSeek
        hit = f["prompt_cache_hit_tokens"]
        prompt = f.get("prompt_tokens", hit + f.get("prompt_cache_miss_tokens", 0))
        return Usage(prompt, hit, write)
    if "prompt_tokens" in f:
        cached = f.get("cached_tokens", f.get("cache_read_input_tokens", f.get("num_cached_tokens")))
        if cached is None and "timings_cache_n" in f:
            cached = f["timings_cache_n"]
        write = write or f.get("cache_creation_input_tokens", 0)
        return Usage(f["prompt_tokens"], cached or 0, write, min(f.get("cache_write_1h", 0), write))
    if "timings_prompt_n" in f:  # llama.cpp without usage
        cache_n = f.get("timings_cache_n", 0)
        return Usage(f["timings_prompt_n"] + cache_n, cache_n, 0)
    if "input_tokens" in f:  # Responses API (or Anthropic without cache fields)
        return Usage(f["input_tokens"], f.get("input_cached_tokens", 0), write)
    return None


_RESPONSE_EVENTS = frozenset({"response.created", "response.in_progress", "response.completed", "response.incomplete"})


def diagnostics(obj: dict[str, Any]) -> Any:
    """A provider's cache diagnostics in one response object or stream event:
    Anthropic's ``diagnostics`` (top level, or in ``message_start.message``),
    OpenAI Responses' ``prompt_cache_diagnostics`` (top level, or in the
    ``response`` of ``response.completed``)."""
    for holder in (obj, obj.get("message"), obj.get("response")):
        if isinstance(holder, dict):
            for key in ("diagnostics", "prompt_cache_diagnostics"):
                if isinstance(holder.get(key), dict):
                    return holder[key]
    return None


def parse_usage(obj: Any) -> Usage | None:
    """Usage of one complete (non-streamed) response body."""
    return _resolve(_fields(obj)) if isinstance(obj, dict) else None


class UsageAccumulator:
    """Feed every parsed stream event; ``result`` is the usage, counted once."""

    __slots__ = ("_fields", "_resolved", "_result", "diagnostics", "message_id")

    def __init__(self) -> None:
        self._fields: dict[str, int] = {}
        self._result: Usage | None = None
        self._resolved = False  # _result is the fields' as fed so far
        self.diagnostics: Any = None  # the provider's cache diagnostics, when it sent any
        # The response's id: an Anthropic message's (its body, or message_start), a
        # Responses response's (its body, or the response of its created / completed events).
        self.message_id: str | None = None

    def feed(self, obj: Any) -> None:
        if isinstance(obj, dict):
            found = _fields(obj)
            if found:
                self._fields.update(found)
                self._resolved = False
            diag = diagnostics(obj)
            if diag is not None:
                self.diagnostics = diag
            kind = obj.get("type")
            if kind == "message_start" or kind == "message":
                self._id(obj.get("message") if kind == "message_start" else obj)
            elif obj.get("object") == "response":
                self._id(obj)
            elif type(kind) is str and kind in _RESPONSE_EVENTS:  # (a list or a dict would not even look up)
                self._id(obj.get("response"))

    def _id(self, holder: Any) -> None:
        if isinstance(holder, dict) and isinstance(holder.get("id"), str) and holder["id"]:
            self.message_id = holder["id"]

    @property
    def result(self) -> Usage | None:
        """Resolved once per event that brought counts (the done hooks, the trace and
        the access log each read it)."""
        if not self._resolved:
            self._result, self._resolved = _resolve(self._fields), True
        return self._result

    @property
    def completion(self) -> int:
        """Output tokens reported (0 when none were)."""
        return self._fields.get("completion_tokens", self._fields.get("output_tokens", 0))
