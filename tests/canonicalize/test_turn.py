"""What a finished request records: a new conversation's system part and tools[] are
the bytes forwarded, cut from the request's own document when no edit changed them."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import canonicalize.turn
from proxy.config import load
from proxy.offline import Offline
from tests.canonicalize.test_packs import hermes_system

# The client's bytes, spaced as a client may send them: what is recorded is cut from
# the bytes forwarded, never serialized again.
TOOLS = b'[ {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {}}} ]'
USER = b'{"role": "user", "content": "hi"}'


def _root(system: str) -> bytes:
    message = b'{"role": "system", "content": ' + orjson.dumps(system) + b"}"
    return b'{"model": "m", "messages": [' + message + b", " + USER + b'], "tools": ' + TOOLS + b', "stream": false}'


def _recorded(raw: bytes) -> tuple[bytes, list[bytes | None]]:
    """What would be forwarded, and the system and tools blobs the store holds after."""

    async def go() -> tuple[bytes, list[bytes | None]]:
        offline = Offline(load(None, env={}))
        sent = await offline.send(raw, tenant="t", reply={"role": "assistant", "content": "ok"})
        assert sent.role == "root" and sent.outcome is not None
        rec = sent.outcome.record
        refs = [rec.system_ref or "", rec.tools_ref or ""]
        return sent.out, await offline.s.store.blobs("t", refs)

    return asyncio.run(go())


def _cut(out: bytes) -> list[bytes | None]:
    """The system part (the system message's bytes, in an array) and tools[] as they sit in ``out``."""
    start = out.index(b'{"role": "system"')
    return [b"[" + out[start : out.index(b", " + USER, start)] + b"]", TOOLS if TOOLS in out else None]


class _NoDocument:
    def __init__(self, raw: bytes) -> None:
        raise AssertionError("the request's own document was not used")


def test_a_root_sent_unedited_records_its_blobs_from_its_own_document(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _root("You are a helpful agent.\nAnswer briefly.")
    monkeypatch.setattr(canonicalize.turn, "JsonDoc", _NoDocument)
    out, blobs = _recorded(raw)
    assert out == raw
    assert blobs == _cut(out)


def test_an_edited_root_records_the_bytes_it_forwarded() -> None:
    raw = _root(hermes_system())  # its memory counters are stripped: the system text is edited
    out, blobs = _recorded(raw)
    assert out != raw
    assert blobs == _cut(out)
