"""tools[]: canonical key order inside each schema, and the lineage's tool order.

JSON objects are unordered, so sorting the keys of a tool's schema changes no
value, only the bytes a chat template renders; every request of every lineage
then renders the same tool the same way.  Lists (``required``, ``enum``) keep
their order: that is part of their value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from canonicalize.shape import Dialect


def _sorted(node: Any) -> tuple[Any, bool]:
    """``node`` with dict keys sorted recursively, and whether anything moved."""
    if isinstance(node, dict):
        keys = list(node)
        ordered = sorted(keys)
        moved = keys != ordered
        out = {}
        for k in ordered:
            out[k], m = _sorted(node[k])
            moved = moved or m
        return (out, True) if moved else (node, False)
    if isinstance(node, list):
        items, moved = [], False
        for v in node:
            nv, m = _sorted(v)
            items.append(nv)
            moved = moved or m
        return (items, True) if moved else (node, False)
    return node, False


def sort_schema_keys(dialect: Dialect, tools: Sequence[Any]) -> bool:
    """Sort the keys inside each tool's schema in place; True if any moved."""
    moved = False
    for tool in tools:
        where = dialect.tool_schema(tool)
        if where is None:
            continue
        container, key = where
        try:
            as_sent = orjson.dumps(container[key])
            ordered = orjson.dumps(container[key], option=orjson.OPT_SORT_KEYS)
        except TypeError:  # e.g. an integer beyond 64 bits: sort in Python instead
            new, m = _sorted(container[key])
            if m:
                container[key] = new
                moved = True
            continue
        if as_sent != ordered:
            container[key] = orjson.loads(ordered)  # dicts keep the (sorted) order they are built in
            moved = True
    return moved


def names(dialect: Dialect, tools: Sequence[Any] | None) -> tuple[str, ...]:
    return tuple(n for n in (dialect.tool_name(t) for t in tools or ()) if n is not None)


def reorder(dialect: Dialect, tools: list[Any], order: Sequence[str]) -> tuple[list[Any], tuple[str, ...]]:
    """Tools in the lineage's order, new ones appended; returns (tools, new order)."""
    rank = {name: i for i, name in enumerate(order)}
    known: list[Any] = []
    new: list[Any] = []
    for tool in tools:
        name = dialect.tool_name(tool)
        (known if name in rank else new).append(tool)
    known.sort(key=lambda t: rank[dialect.tool_name(t)])  # type: ignore[index]
    extended = tuple(order) + tuple(n for n in names(dialect, new) if n not in rank)
    return known + new, extended
