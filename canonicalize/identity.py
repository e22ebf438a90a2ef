"""Content identity: what names a request's system part, its tools[] and the shape
of its prompt, for the store and for prefix prediction.

- a *ref* (:func:`system_ref`, :func:`tools_ref`) is the digest of a part's exact
  parse: the key its forwarded bytes are stored under, which a fork and a later
  request of the lineage fetch back;
- a :class:`ToolsId` tells tools[] as sent (``form``) from tools[] as meant
  (``meaning``: the same tools and schemas, keys in any order);
- a :class:`~canonicalize.lineage.Fingerprint` (:func:`fingerprint`) is what the
  prefix predictor compares between a request and its parent: the model, the
  prompt-shaping params (``PROMPT_PARAMS`` and the inherited ones), the system
  text in blocks of ``BLOCK_BYTES``, the tools' ref and sizes.

Every function here is a pure function of content.  Those given a
:class:`~canonicalize.texts.Texts` memo keep what they derive from a big system
text with it, per scope (the tenant), and answer as they would without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from canonicalize import chain
from canonicalize.lineage import Fingerprint
from canonicalize.texts import Texts
from canonicalize.wire.base import Exchange, Slot

BLOCK_BYTES = 256  # the fingerprint's unit of the system text (prefix prediction's granularity)
SHORT_TEXT = 256  # a system text shorter than this is serialized again rather than looked up
# Request members that shape the prompt the upstream renders (chat templates' kwargs,
# reasoning, tool choice, structured output): a change is a prefix break,
# ``params_changed``.  Sampling members (temperature, max_tokens, ...) are not.
PROMPT_PARAMS = (
    "chat_template_kwargs",
    "enable_thinking",
    "reasoning_effort",
    "reasoning",
    "thinking",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "mcp_servers",
    "response_format",
    "text",
    "output_config",
    "output_format",
)


@dataclass(frozen=True, slots=True)
class ToolsId:
    """tools[] as sent (``form``: its exact parse) and as meant (``meaning``: a set of
    schemas, key order ignored)."""

    form: str
    meaning: str
    names: tuple[str, ...]
    size: int  # bytes, compact (prefix prediction)


def tools_form(tool_list: list[Any]) -> bytes | None:
    """tools[]' compact JSON, what its ``form`` digests; None when it cannot be written
    (e.g. an integer beyond 64 bits): such tools are forwarded as sent, never replaced."""
    try:
        return orjson.dumps(tool_list)
    except TypeError:
        return None


def identify_tools(exchange: Exchange, tool_list: Sequence[Any], form: bytes, ref: str) -> ToolsId:
    """The :class:`ToolsId` of ``tool_list``, whose compact JSON is ``form`` and its digest
    ``ref``; tool names are found where the wire API puts them."""
    canon = sorted(orjson.dumps(t, option=orjson.OPT_SORT_KEYS) for t in tool_list)
    names = tuple(n for n in (exchange.tool_name(t) for t in tool_list) if n is not None)
    return ToolsId(ref, chain.digest(b"\x1e".join(canon)), names, len(form))


def tools_ref(exchange: Exchange, body: dict[str, Any]) -> str:
    """The ref of the tools[] ``body`` forwards: the digest of their exact parse."""
    tool_list = exchange.tools(body)
    if not tool_list:
        return chain.digest(b"[]")
    try:
        return chain.digest(orjson.dumps(tool_list))
    except TypeError:
        return chain.digest(repr(tool_list).encode("utf-8", "surrogatepass"))


def system_ref(texts: Texts, value: Any, scope: str) -> str:
    """``chain.digest(orjson.dumps(value))`` for a system part ``value``; when it is one
    text (a string, or one message of only a role and that content) the ref is kept
    with the text's entry in ``scope``'s memo: a lineage forwards the same system
    part turn after turn, and serializing it is a pass over the whole prompt."""
    text: Any = value
    key: tuple[Any, ...] = ("system_ref",)
    if type(value) is list and len(value) == 1 and type(m := value[0]) is dict and len(m) == 2:
        role, text = m.get("role"), m.get("content")
        if type(role) is not str or next(iter(m)) != "role":  # serialized as role, then content
            text = None
        key = ("system_ref", role)
    if type(text) is not str or len(text) < SHORT_TEXT:
        return chain.digest(orjson.dumps(value))
    entry = texts.entry(scope, text)  # (finalize's texts are kept: found by identity)
    ref: str | None = entry.derived.get(key)
    if ref is None:
        ref = texts.derive(entry, key, chain.digest(orjson.dumps(value)))
    return ref


def fingerprint(
    texts: Texts,
    inherit_params: Sequence[str],
    body: dict[str, Any],
    exchange: Exchange,
    *,
    tools_ref: str,
    tools_len: int,
    n_messages: int,
    system_slots: Sequence[Slot] | None = None,
    scope: str | None = None,
) -> Fingerprint:
    """What prefix prediction compares, for ``body`` as it is (forwarded or as received);
    ``system_slots`` are its system slots when the caller has them; with a ``scope``
    (the tenant) the system text's blocks are kept with it in ``texts``."""
    slots = exchange.system_slots(body) if system_slots is None else system_slots
    parts = [s.get() for s in slots]
    joined = parts[0] if len(parts) == 1 else "\x1e".join(parts)
    if scope is None:
        blocks, size = text_blocks(joined)
    else:
        entry = texts.entry(scope, joined)
        found = entry.derived.get("blocks")
        if found is None:
            found = text_blocks(joined)
            found = texts.derive(entry, "blocks", found, 24 * len(found[0]))  # a short str per block
        blocks, size = found
    params = {p: body[p] for p in (*inherit_params, *PROMPT_PARAMS) if p in body}
    try:
        params_hash = hash_text(orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()) if params else ""
    except TypeError:
        params_hash = hash_text(repr(sorted(params.items())))
    return Fingerprint(
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        params=params_hash,
        system_blocks=blocks,
        system_len=size,
        tools=tools_ref,
        tools_len=tools_len,
        n_messages=n_messages,
    )


def text_blocks(text: str) -> tuple[tuple[str, ...], int]:
    """The fingerprint's hashes of ``text`` in BLOCK_BYTES blocks of its UTF-8, and its length in bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    h = xxhash.xxh64_hexdigest
    return tuple([h(raw[i : i + BLOCK_BYTES]) for i in range(0, len(raw), BLOCK_BYTES)]), len(raw)


def hash_text(text: str) -> str:
    """A short content hash of ``text`` (skeletons, heads, params)."""
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
