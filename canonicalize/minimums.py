"""The providers' minimum cacheable prompt lengths, and a request's stable prefix.

A provider caches nothing of a prompt shorter than its model's minimum (no error:
the cache counters just stay at 0).  ``provider_cache.min_tokens`` names the
minimum per model; :data:`BUILT_IN` holds the ones the providers publish (see
docs/metrics.md for the sources and their dates), matched by the model name's
prefix once normalized (lower case, any ``provider/`` route dropped, dots as
dashes: ``anthropic/claude-opus-4.6`` is ``claude-opus-4-6``).

The *stable prefix* of a request is what a later request of its conversation can
reuse: the system part, tools[] and the history before the last user message
(the turn being asked is new).  :func:`stable_bytes` measures it in the bytes
prefixpin measures everything in; :func:`stable_tokens` turns that into tokens at
the request's own rate when the upstream reported its prompt tokens, else at
:data:`BYTES_PER_TOKEN`.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from canonicalize.lineage import Fingerprint
from canonicalize.wire.base import Exchange

BYTES_PER_TOKEN = 4  # the usual rate of English and JSON in BPE tokenizers, when nothing better is known

_OPENAI = 1024  # every OpenAI model with prompt caching (gpt-4o and later; GPT-5.6 and later: 1,024 visible tokens)
# (normalized model-name prefix, minimum tokens); the longest matching prefix wins.
BUILT_IN: tuple[tuple[str, int], ...] = (
    ("gpt-4o", _OPENAI),
    ("chatgpt-4o", _OPENAI),
    ("gpt-4-1", _OPENAI),
    ("gpt-5", _OPENAI),
    ("gpt-6", _OPENAI),
    ("o1", _OPENAI),
    ("o3", _OPENAI),
    ("o4-mini", _OPENAI),
    ("claude-opus-4-7", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-opus-4-8", 1024),
    ("claude-opus-4-1", 1024),
    ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024),
    ("claude-3-7-sonnet", 1024),
    ("claude-3-5-sonnet", 1024),
    ("claude-3-opus", 1024),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
    ("gemini-2-5-flash", 2048),
    ("gemini-2-5-pro", 2048),
    ("gemini-3", 4096),
    ("gemini-4", 4096),
)


_NONE: Mapping[str, int] = MappingProxyType({})


def normalized(model: str) -> str:
    """``model`` as :data:`BUILT_IN` names it: lower case, without a ``provider/``
    route, dots as dashes."""
    return model.rsplit("/", 1)[-1].lower().replace(".", "-")


def minimum(model: Any, configured: Mapping[str, int] = _NONE) -> int | None:
    """The minimum cacheable prompt of ``model`` in tokens: ``configured`` (the
    model's exact name) first, then :data:`BUILT_IN`; None when unknown.  0: no
    minimum (a configured 0 turns the built-in one off)."""
    if not isinstance(model, str) or not model:
        return None
    if model in configured:
        return configured[model]
    name = normalized(model)
    best: tuple[int, int] | None = None
    for prefix, tokens in BUILT_IN:
        if name.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), tokens)
    return best[1] if best is not None else None


def stable_bytes(
    exchange: Exchange, body: dict[str, Any], fp: Fingerprint, sizes: Sequence[int], offset: int = 0
) -> tuple[int, int]:
    """(stable prefix, whole prompt) in bytes, as prefixpin measures them (the
    system part and tools[] of the fingerprint ``fp``, each history message's
    canonical size in ``sizes``; ``offset``: entries of ``sizes`` before the body's
    own history, a previous response's tip)."""
    history = exchange.history(body)
    messages = sizes[offset:]
    # The last user message, found from the end (it is the newest message, as a rule).
    last = next((i for i in range(len(history) - 1, -1, -1) if exchange.is_user(history[i])), len(messages))
    head = fp.system_len + fp.tools_len
    return head + sum(messages[:last]), head + sum(messages)


def stable_tokens(stable: int, total: int, prompt: int | None, *, continued: bool = False) -> int:
    """The stable prefix in tokens: at the request's own rate (``prompt`` tokens for
    ``total`` bytes) when the upstream said; else at :data:`BYTES_PER_TOKEN`.
    ``continued``: the prompt also holds a conversation the provider keeps
    (Responses' ``previous_response_id``), all of it before the new turn."""
    if prompt is None or prompt <= 0 or total <= 0:
        return stable // BYTES_PER_TOKEN
    if continued:
        return max(prompt - (total - stable) // BYTES_PER_TOKEN, 0)
    return prompt * stable // total


__all__ = ["BUILT_IN", "BYTES_PER_TOKEN", "minimum", "normalized", "stable_bytes", "stable_tokens"]
