"""Fork repair: a fork is forwarded with its parent's system part, tools[] and
prompt-shaping params instead of its own, so that it extends the prefix its
parent left in the upstream's cache.

The parent's parts come as the bytes the store recorded when the parent was
forwarded (its *blobs*, named by ref in its record), and are spliced in whole;
the parse is updated to match.  Only what differs is replaced, each replacement
named in the rewrites (``fork.system``, ``fork.tools``, ``fork.params``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from canonicalize.analysis import Prepared
from canonicalize.edits import AddMember, DeleteMember, Op, SetMember, SetValue
from canonicalize.lineage import LineageRecord, Lookup
from canonicalize.wire.base import Exchange


def repair_fork(
    inherit_params: Sequence[str], prep: Prepared, record: LineageRecord, blobs: dict[str, bytes], rewrites: list[str]
) -> list[Op]:
    """The edits that forward ``record``'s system part, tools[] and ``inherit_params``
    (``blobs`` holds its system and tools refs) instead of the request's own."""
    body, exchange = prep.body, prep.exchange
    ops: list[Op] = []
    assert record.system_ref is not None and record.tools_ref is not None
    system_blob, tools_blob = blobs[record.system_ref], blobs[record.tools_ref]
    if orjson.dumps(exchange.system_value(body)) != orjson.dumps(orjson.loads(system_blob)):
        ops += exchange.set_system(body, system_blob)
        rewrites.append("fork.system")
    parent_tools = orjson.loads(tools_blob)
    if (exchange.tools(body) or []) != (parent_tools or []):
        ops.append(_replace_tools(exchange, body, parent_tools, tools_blob))
        rewrites.append("fork.tools")
    params = _inherit(inherit_params, body, record.params)
    if params:
        ops += params
        rewrites.append("fork.params")
    return ops


def _replace_tools(exchange: Exchange, body: dict[str, Any], parent_tools: Any, blob: bytes) -> Op:
    path = exchange.tools_path(body)
    if parent_tools and path != ("tools",):  # tools inside the body (a Responses input item)
        set_tools(exchange, body, parent_tools)
        return SetValue(path, blob)
    if parent_tools:
        had = "tools" in body
        body["tools"] = parent_tools
        return SetMember((), "tools", blob) if had else AddMember("tools", blob)
    body.pop("tools", None)
    return DeleteMember((), "tools")


def _inherit(names: Sequence[str], body: dict[str, Any], recorded: dict[str, str]) -> list[Op]:
    """The edits that give ``body`` the recorded params (raw JSON text) of ``names``,
    and remove those the parent did not send."""
    ops: list[Op] = []
    for p in names:
        if p in recorded:
            raw = recorded[p].encode("utf-8", "surrogatepass")
            value = orjson.loads(raw)
            if p not in body or body[p] != value:
                ops.append(SetMember((), p, raw) if p in body else AddMember(p, raw))
                body[p] = value
        elif p in body:
            del body[p]
            ops.append(DeleteMember((), p))
    return ops


def set_tools(exchange: Exchange, body: dict[str, Any], tools: Any) -> None:
    """Put ``tools`` where ``exchange`` keeps tools[] in the parse."""
    *parents, key = exchange.tools_path(body)
    node: Any = body
    for k in parents:
        node = node[k]
    node[key] = tools


def branch(prep: Prepared, lookup: Lookup) -> int:
    """Where a new fork leaves its parent's history: after the parent's last reply it
    replays (recorded or not).  The fork owns only the links past this point, so the
    parent's next turn, which replays the same reply, stays the parent's; a lineage
    otherwise gets its links from the deepest recorded one on, since another session
    may own that one too."""
    last = prep.signals.last_assistant
    return max(lookup.depth, last + 1 if last is not None else 0)
