"""Ephemeral blocks: the history a lineage forwarded, kept when the agent drops a
block from it (SPEC section 2d, ``learned.history``; ``learn: pin`` only).

Agents put reminders on the newest user message (``<system-reminder>The current
date is ...</system-reminder>`` as a content part, a format reminder appended
after a blank line) and drop them from history in the next request.  That
rewrites a message the upstream has already seen: the prefix breaks there, and
every later turn of the conversation with it.  With ``learn: pin`` the lineage
keeps the bytes it forwarded for its newest user message (``tail``: a blob of
the tenant's, ``h:<link>``), and when a later request sends that message again
with *only* a block removed, the recorded bytes are forwarded instead; the
lineage keeps each such restore (``restores``: the message's index, its hash as
the agent now sends it, the blob) and forwards it again in every later request
whose message there is still the agent's same one.  Nothing else in a history
is ever changed: a message that differs from the recorded one in any other way
(a word, a value, a paragraph edited) reaches the upstream as sent.

A block is a whole text part of a message's content (parts kept in order), or
a run of whole lines at the start or the end of a text (after a line break), or
a tag block (``<name ...>`` ... ``</name>``, whole lines) anywhere in it; the
message must keep some text of its own.

When the dropped block was in the conversation's *first* message, nothing of
the request's chain is recorded (its first link differs): the lineage is found
by its ``stem``, a link over the first message with every tag block dropped and
every value masked (*marked* once, by the lineage's root: a mark is the tenant's,
not one conversation's, and names the lineages that made it with their first
messages, :data:`Marker`), then checked: the request's history, with the
recorded message in place, must be the lineage's (its chain recomputed and
looked up again).

The messages before the first reply are the agent's environment too (``Today's
date is ...``, ``<env>``, ``<environment_context>``), re-rendered when a session
is resumed.  The first message may also differ from the recorded one by values
(``Friday`` -> ``Saturday``), pinned as learned spans (scope ``messages``: the
recorded message is forwarded, the model told the new date in a note) only where
the value's line is the agent's template: seen, with its values masked, in the
first messages of another conversation of the tenant (each root marks its
value lines' ``template`` links, at most ``MAX_TEMPLATES``).  What a user typed
there (a task with a deadline, a version) is in no other conversation's first
message: it reaches the upstream as sent.  Bounds: ``MAX_RESTORES`` restores per
lineage (past them a new one is not kept: that message is forwarded as sent); a
first message compared with a recorded one spends at most one request's budget
(:func:`canonicalize.textdiff.fresh`), all its parts together; a root scans at most
``MAX_SCANNED`` characters of its first messages' value lines (its stem, its
templates: the lines past them are left as they are).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from canonicalize import chain, textdiff, values
from canonicalize.analysis import Prepared
from canonicalize.edits import Op, SetValue
from canonicalize.jsonspan import Path
from canonicalize.lineage import LineageRecord, Lookup
from canonicalize.spans import Span, spans_of

TAIL = "h:"  # blob ref prefix: a lineage's newest user message as forwarded
STEM_ROOT = b"prefixpin/stem/1"
TEMPLATE_ROOT = b"prefixpin/template/1"
MAX_RESTORES = 64
MAX_TEMPLATES = 32  # value lines a root records as template links
MAX_TEMPLATE_LOOKUPS = 4  # changed lines a request may check (more: not pinned)
MAX_SCANNED = 8192  # characters of a first message's value lines tokenized (its stem, its templates)

# A lineage that marked a link (a root marks its stem and its template lines, kept once per
# tenant by the stores, newest first, LINKS_PER_KEY per link): its id and its first message's ref.
Marker = tuple[str, str]
RULE = "learned.history"
_TAG = re.compile(r"<([A-Za-z][\w:.-]*)\b[^>]*>.*?</\1>", re.DOTALL)  # (whole: is_tag_block)
_NAME = re.compile(r"[A-Za-z][\w:.-]*")
_TAG_LINES = re.compile(r"(?m)^[ \t]*<([A-Za-z][\w:.-]*)\b[^>\n]*>[\s\S]*?</\1>[ \t]*(?:\n|$)")


# -- where things are ---------------------------------------------------------------------------
def item_path(prep: Prepared, index: int) -> Path | None:
    """The path of history item ``index`` (a chain index) in the request's body; None
    when it is not an item of the body's array (a previous response's tip, a string
    ``input``)."""
    history = prep.history
    j = index - prep.offset
    items = prep.body.get(prep.exchange.items_key)
    if not 0 <= j < len(history) or type(items) is not list:
        return None
    item = history[j]
    at = next((k for k, it in enumerate(items) if it is item), None)
    return None if at is None else (prep.exchange.items_key, at)


def _item(prep: Prepared, index: int) -> Any:
    history = prep.history
    j = index - prep.offset
    return history[j] if 0 <= j < len(history) else None


def item_hash(prep: Prepared, item: Any) -> str:
    """The hash of a history item as the agent sent it."""
    return chain.digest(prep.exchange.canonical_message(item))


def tail(prep: Prepared, depth: int) -> tuple[int, str, Path] | None:
    """The request's newest history item when it is a user message new in this request
    (``depth`` items are recorded): its index, the ref its forwarded bytes are kept
    under, and its path.  None: the lineage keeps the tail it had."""
    index = len(prep.links) - 1
    if index < depth or index < prep.offset:
        return None
    item = _item(prep, index)
    if not prep.exchange.is_user(item):
        return None
    path = item_path(prep, index)
    return None if path is None else (index, TAIL + prep.links[index].hex(), path)


# -- the stem: a lineage found when its first message lost a block ------------------------------------
def stem(prep: Prepared) -> bytes | None:
    """The stem link of the request's first history item (a user message): its
    canonical form with every tag block dropped and every value masked."""
    item = _item(prep, prep.offset) if prep.links else None
    if prep.offset or not isinstance(item, dict) or not prep.exchange.is_user(item):
        return None
    loose = dict(item)
    loose["content"] = _loose(item.get("content"))
    return chain.link(STEM_ROOT, prep.exchange.canonical_message(loose))


def _loose(content: Any) -> Any:
    if isinstance(content, str):
        return _masked(_TAG_LINES.sub("", content))
    if isinstance(content, list):
        kept = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                if is_tag_block(text.strip()):
                    continue
                part = {**part, "text": _masked(_TAG_LINES.sub("", text))}
            kept.append(part)
        return kept
    return content


def is_tag_block(text: str) -> bool:
    """``text`` is one tag block, ``<name ...>`` ... ``</name>`` (``_TAG`` matches it
    whole), told from its two tags: its body is not scanned."""
    close = text.rfind("</")  # a name holds no "/": the closing tag starts at the last "</"
    name = text[close + 2 : -1]
    if close < 0 or not text.endswith(">") or not _NAME.fullmatch(name):
        return False
    opening = re.match(rf"<{re.escape(name)}\b[^>]*>", text)
    return opening is not None and opening.end() <= close


def _masked(text: str) -> str:
    """``text`` with every value masked; past ``MAX_SCANNED`` characters of lines that
    may hold a value, the rest as it is (a stem that finds no lineage: the request goes
    as sent)."""
    out: list[str] = []
    pos = 0
    for _, _, found in _scanned([text]):
        for kind, start, end, _ in found:
            out += (text[pos:start], f"\x00{kind}")
            pos = end
    out.append(text[pos:])
    return "".join(out)


def _scanned(texts: Iterable[str]) -> Iterator[tuple[str, int, list[values.Token]]]:
    """Each line of ``texts`` that holds a value: its text, where it starts in it, and
    its values (offsets in its text), until ``MAX_SCANNED`` characters of lines that
    may hold one were scanned."""
    left = MAX_SCANNED
    for text in texts:
        for start, end in values.value_lines(text):
            left -= end - start
            if left < 0:
                return
            found = values.value_tokens(text, start, end)
            if found:
                yield text[start:end], start, found


# -- templates: the agent's own lines in the messages before the first reply ----------------------
def template_link(line: str) -> bytes:
    """The link a value line of a first message is marked under (every value masked)."""
    return _template_link(line, 0, values.value_tokens(line))


def _template_link(line: str, at: int, found: list[values.Token]) -> bytes:
    """:func:`template_link` of ``line``, whose values (offsets ``at`` before) are ``found``."""
    out: list[str] = []
    pos = 0
    for _, start, end, _ in found:
        out += (line[pos : start - at], "\x00")
        pos = end - at
    out.append(line[pos:])
    return chain.link(TEMPLATE_ROOT, "".join(out).encode("utf-8", "surrogatepass"))


def templates(prep: Prepared) -> list[bytes]:
    """The template links of the value lines of the user messages before the request's
    first reply: dates, times and ids first, at most ``MAX_TEMPLATES``."""
    first = prep.signals.first_assistant
    history = prep.history
    end = len(history) if first is None else max(first - prep.offset, 0)
    ranked: list[tuple[bool, bytes]] = []
    texts = (t for item in history[:end] if prep.exchange.is_user(item) for t in _texts(item.get("content")))
    for line, at, found in _scanned(texts):
        ranked.append((all(k == "counter" for k, _, _, _ in found), _template_link(line, at, found)))
    ranked.sort(key=lambda r: r[0])  # stable: the first lines first among equals
    return list(dict.fromkeys(link for _, link in ranked))[:MAX_TEMPLATES]


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if _is_text(p)]
    return []


@dataclass(frozen=True, slots=True)
class Head:
    """A request whose first message is the lineage's recorded one but for dropped blocks
    and values: what forwarding the recorded one takes."""

    ref: str  # the recorded first message
    agent: str  # the request's first message's hash (the restore's key)
    spans: tuple[Span, ...]  # the values changed (scope ``messages``): each must be a template's
    lines: tuple[bytes, ...]  # the template links of their lines, to check
    links: list[bytes]  # the request's chain with the recorded message in place
    dropped: bool  # a block was dropped too


def stem_heads(prep: Prepared, found: Sequence[LineageRecord]) -> tuple[LineageRecord, ...]:
    """Of the lineages that marked the request's stem (newest first), those ``prep``
    may continue: roots of its session identity that recorded their first message."""
    return tuple(r for r in found if r.kind == "root" and r.first is not None and r.identity == prep.signals.identity)


def match_head(prep: Prepared, rec: LineageRecord, blobs: Mapping[str, bytes]) -> Head | None:
    """How the request's first message relates to ``rec``'s recorded one; None: it is not
    that message with blocks dropped and values changed."""
    ref = rec.first
    raw = blobs.get(ref or "")
    item = _item(prep, 0) if not prep.offset else None
    if ref is None or raw is None or not isinstance(item, dict):
        return None
    recorded = recorded_item(raw, note_lines(rec, 0))
    if not isinstance(recorded, dict) or recorded == item:
        return None
    if dropped_block(recorded, item):
        found: tuple[list[Span], bool] | None = ([], True)
    else:
        found = _values_changed(recorded, item)
    if found is None:
        return None
    spans, dropped = found
    lines = tuple(dict.fromkeys(template_link(s.line) for s in spans))
    if len(lines) > MAX_TEMPLATE_LOOKUPS:
        return None
    return Head(ref, item_hash(prep, item), tuple(spans), lines, relinked(prep, 0, recorded), dropped)


def _values_changed(recorded: dict[str, Any], item: dict[str, Any]) -> tuple[list[Span], bool] | None:
    """The value changes that turn ``recorded``'s content into ``item``'s (parts dropped
    too, for list contents), and whether a part was dropped; None: anything else changed.
    The texts compared share one budget (:func:`canonicalize.textdiff.fresh`)."""
    if {k: v for k, v in recorded.items() if k != "content"} != {k: v for k, v in item.items() if k != "content"}:
        return None
    old, new = recorded.get("content"), item.get("content")
    budget = textdiff.fresh()
    if isinstance(old, str) and isinstance(new, str):
        spans, _ = _text_values(old, new, budget)
        return (spans, False) if spans else None
    if not (isinstance(old, list) and isinstance(new, list)):
        return None
    out: list[Span] = []
    j = 0
    for part in old:
        if j < len(new) and part == new[j]:
            j += 1
        elif j < len(new) and _is_text(part) and _is_text(new[j]) and _same_but_text(part, new[j]):
            spans, spent = _text_values(part["text"], new[j]["text"], budget)
            budget = budget.less(spent)
            if spans:
                out += spans
                j += 1
            # else: not this part with fresh values: a part dropped (new[j] is matched next)
        elif not _is_text(part):
            return None
    if j != len(new) or not out:
        return None
    return out, len(new) < len(old)


def _same_but_text(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "text"} == {k: v for k, v in b.items() if k != "text"}


def _text_values(old: str, new: str, budget: textdiff.Budget) -> tuple[list[Span], textdiff.Budget]:
    """The value changes from ``old`` to ``new`` (scope ``messages``), [] when anything
    else changed (the comparison stops as soon as it is sure), and what it spent of
    ``budget``."""
    diff = textdiff.changes(old, new, keep=1.0, budget=budget)
    if diff.others or not diff.values:
        return [], diff.spent
    return list(spans_of(diff.changes, old, new, "messages")), diff.spent


def is_template(prep: Prepared, rec: LineageRecord, markers: Sequence[Marker]) -> bool:
    """A template link, marked by ``markers``, is another conversation's first message's
    too: a lineage other than ``rec`` marked it whose first message is neither ``rec``'s
    nor the request's (a side request replaying this conversation has the same one)."""
    mine = {rec.first, TAIL + prep.links[0].hex() if prep.links else None}
    return any(lineage != rec.id and first not in mine for lineage, first in markers)


# -- is a message the recorded one with a block dropped? -------------------------------------------
def dropped_block(recorded: Any, item: Any) -> bool:
    """``item`` is ``recorded`` with one or more blocks dropped (module docstring)."""
    if not (isinstance(recorded, dict) and isinstance(item, dict)) or recorded == item:
        return False
    if {k: v for k, v in recorded.items() if k != "content"} != {k: v for k, v in item.items() if k != "content"}:
        return False
    old, new = recorded.get("content"), item.get("content")
    if isinstance(old, str) and isinstance(new, str):
        return _dropped_text(old, new)
    if isinstance(old, list) and isinstance(new, list):
        return _dropped_parts(old, new)
    return False


def _dropped_parts(old: list[Any], new: list[Any]) -> bool:
    """``new`` is ``old`` with whole text parts removed, the rest in order, some text left."""
    if len(new) >= len(old) or not any(_is_text(p) for p in new):
        return False
    i = 0
    for part in old:
        if i < len(new) and part == new[i]:
            i += 1
        elif not _is_text(part):
            return False
    return i == len(new)


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str)


def _dropped_text(old: str, new: str) -> bool:
    """``new`` is ``old`` less a run of whole lines at its start or end, or less tag blocks
    of whole lines anywhere; some text left."""
    if not new.strip() or len(new) >= len(old):
        return False
    if old.startswith(new) and (new.endswith("\n") or old[len(new)] == "\n"):
        return True
    cut = len(old) - len(new)
    if old.endswith(new) and (new.startswith("\n") or old[cut - 1] == "\n"):
        return True
    return _TAG_LINES.sub("", old) == _TAG_LINES.sub("", new) and _TAG_LINES.sub("", new) == new


def without_notes(item: Any, lines: Sequence[str]) -> Any:
    """A forwarded item less the date notes the lineage appended to it (the agent's own)."""
    if not lines or not isinstance(item, dict):
        return item
    content = item.get("content")

    def strip(text: str) -> str:
        for line in reversed(lines):
            for tail_ in (f"\n\n{line}", line):
                if text.endswith(tail_):
                    text = text[: len(text) - len(tail_)]
                    break
        return text

    if isinstance(content, str):
        return {**item, "content": strip(content)}
    if isinstance(content, list):
        parts = list(content)
        for k in range(len(parts) - 1, -1, -1):
            if _is_text(parts[k]):
                parts[k] = {**parts[k], "text": strip(parts[k]["text"])}
                break
        return {**item, "content": parts}
    return item


# -- restoring ----------------------------------------------------------------------------------
def refs(prep: Prepared, lookup: Lookup, parent: LineageRecord) -> tuple[str, ...]:
    """The blobs restoring the lineage's history takes: its restores', and its tail's
    when the request's history departs from the lineage's right there."""
    out = [ref for _, _, ref in parent.restores]
    if parent.first is not None and parent.first not in out and lookup.depth == 0:
        out.append(parent.first)
    if parent.tail is not None and parent.tail[0] == lookup.depth and parent.tail[1] not in out:
        out.append(parent.tail[1])
    return tuple(out)


@dataclass(slots=True)
class Restored:
    """What restoring the lineage's history does to a request."""

    ops: list[Op] = field(default_factory=list)
    restores: tuple[tuple[int, str, str], ...] = ()  # the lineage's, with any new one
    indices: frozenset[int] = frozenset()  # the items forwarded as recorded (no note goes there)
    new: int | None = None  # the index restored from the tail now (its first restore)


def restore(
    prep: Prepared, lookup: Lookup, parent: LineageRecord, blobs: Mapping[str, bytes], head: Head | None = None
) -> Restored:
    """The lineage's restores, each where the agent still sends that message, and a new
    one for the lineage's tail when the request sends it with a block dropped (or for its
    first message: ``head``).  Each restored item's parse is set to the recorded item, so
    the parse is what is forwarded."""
    restores = parent.restores
    if head is not None:
        restores = (*(r for r in restores if r[0] != 0), (0, head.agent, head.ref))
    out = Restored(restores=restores)
    indices: set[int] = set()
    for index, agent, ref in restores:
        item, path, raw = _item(prep, index), item_path(prep, index), blobs.get(ref)
        if item is None or path is None or raw is None or item_hash(prep, item) != agent:
            continue
        _put(prep, path, raw, out)
        indices.add(index)
    found = _tail_restore(prep, lookup, parent, blobs)
    if found is not None and len(out.restores) < MAX_RESTORES:
        index, agent, ref, path = found
        _put(prep, path, blobs[ref], out)
        indices.add(index)
        out.restores += ((index, agent, ref),)
        out.new = index
    out.indices = frozenset(indices)
    return out


def _tail_restore(
    prep: Prepared, lookup: Lookup, parent: LineageRecord, blobs: Mapping[str, bytes]
) -> tuple[int, str, str, Path] | None:
    """(index, the agent's hash, ref, path) when the request sends the lineage's tail with
    a block dropped, at the depth its history departs from the lineage's."""
    if parent.tail is None or parent.tail[0] != lookup.depth:
        return None
    index, ref = parent.tail
    raw, item, path = blobs.get(ref), _item(prep, index), item_path(prep, index)
    if raw is None or item is None or path is None:
        return None
    recorded = recorded_item(raw, [line for i, line, _ in parent.notes if i == index])
    if recorded is None or not dropped_block(recorded, item):
        return None
    return index, item_hash(prep, item), ref, path


def recorded_item(raw: bytes, lines: Sequence[str]) -> Any:
    """A recorded (forwarded) item as the agent had sent it: parsed, less its notes."""
    try:
        return without_notes(orjson.loads(raw), lines)
    except orjson.JSONDecodeError:
        return None


def _put(prep: Prepared, path: Path, raw: bytes, out: Restored) -> None:
    out.ops.append(SetValue(path, raw))
    items = prep.body[prep.exchange.items_key]
    items[path[1]] = orjson.loads(raw)


def relinked(prep: Prepared, index: int, recorded: Any) -> list[bytes]:
    """The request's chain with ``recorded`` (the agent's item as the lineage had it) at
    ``index``: what the lineage recorded, when the rest of the history is its."""
    history = prep.history
    j = index - prep.offset
    prev = prep.links[index - 1] if index else chain.ROOT
    links, _ = chain.links(prep.exchange, [recorded, *history[j + 1 :]], prev=prev)
    return [*prep.links[:index], *links]


def note_lines(parent: LineageRecord, index: int) -> list[str]:
    """The note lines the lineage appended to item ``index``."""
    return [line for i, line, _ in parent.notes if i == index]


__all__ = [
    "MAX_RESTORES",
    "RULE",
    "TAIL",
    "Head",
    "Marker",
    "Restored",
    "dropped_block",
    "is_template",
    "item_hash",
    "item_path",
    "match_head",
    "recorded_item",
    "refs",
    "relinked",
    "restore",
    "stem",
    "tail",
    "template_link",
    "templates",
    "without_notes",
]
