"""What a finished request records: a new conversation's system part and tools[] are
the bytes forwarded, cut from the request's own document when no edit changed them."""

from __future__ import annotations

import asyncio

import orjson
import pytest

import canonicalize.turn
from canonicalize import Settings
from proxy.config import load
from proxy.offline import Offline
from tests.canonicalize.test_packs import hermes_system

TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {}}}]


def _root(system: str) -> bytes:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
    return orjson.dumps({**body, "tools": TOOLS, "stream": False})


def _recorded(raw: bytes) -> tuple[bytes, list[bytes | None]]:
    """What would be forwarded, and the system and tools blobs the store holds after."""

    async def go() -> tuple[bytes, list[bytes | None]]:
        offline = Offline(load(None, env={}), settings=Settings(packs=("generic", "hermes")))
        sent = await offline.send(raw, tenant="t", reply={"role": "assistant", "content": "ok"})
        assert sent.role == "root" and sent.outcome is not None
        rec = sent.outcome.record
        refs = [rec.system_ref or "", rec.tools_ref or ""]
        return sent.out, await offline.s.store.blobs("t", refs)

    return asyncio.run(go())


def _cut(out: bytes) -> list[bytes | None]:
    """The system part and tools[] as they sit in ``out`` (compact JSON, as these bodies are)."""
    body = orjson.loads(out)
    return [orjson.dumps(body["messages"][:1]), orjson.dumps(body["tools"])]


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
