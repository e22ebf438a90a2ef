"""The offline flow (proxy.offline) on bodies of every wrong type: nothing of
prefixpin's own fails, and what goes upstream is the client's bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.datastructures import Headers

from canonicalize import CHAT, MESSAGES, Exchange
from proxy.config import load
from proxy.drive import read_named
from proxy.offline import Offline
from proxy.store.memory import MemoryStore
from tests.arrivals import VARIANTS, Arrivals, switching_often
from tests.flows import Harness

WRONG: list[Any] = [
    None,
    1,
    1.5,
    "s",
    True,
    [],
    {},
    [1],
    ["s"],
    [{}],
    [{"role": []}],
    [{"role": {"a": 1}, "content": "x"}],
    [{"role": "system", "content": 5}],
    [{"role": "system", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": [{"type": []}]}],
    [{"role": "assistant", "tool_calls": 5}],
    [{"role": "assistant", "tool_calls": [{"function": 5}]}],
    [{"role": "assistant", "tool_calls": [{"function": {"name": [], "arguments": 5}}]}],
    [{"type": "function", "function": {"name": 5, "description": 6, "parameters": []}}],
    [{"name": {}}],
]
KEYS = ["messages", "tools", "system", "stream", "stream_options", "model", "chat_template_kwargs"]


@pytest.mark.parametrize("exchange", [CHAT, MESSAGES], ids=lambda e: e.name)
@pytest.mark.parametrize("key", KEYS)
def test_wrongly_typed_members_never_fail_open(exchange: Exchange, key: str) -> None:
    h = Harness()
    for value in WRONG:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], key: value}
        raw = orjson.dumps(body)
        sent = h.send(raw, exchange=exchange)
        assert not sent.flow.failed, (key, value)
        if not sent.flow.outbound.ops:
            assert sent.raw == raw


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b'"s"', b"null", b"\xff\xfe", b'{"messages": [}'])
def test_bodies_that_are_not_json_objects_go_as_sent(raw: bytes) -> None:
    sent = Harness().send(raw)
    assert sent.role == "bypass" and sent.raw == raw


def test_a_body_is_kept_for_parsing_by_pieces_only_in_its_tenants_scope() -> None:
    """A request with a credential keeps its body for its tenant's next one; an isolated
    one (no credential, ``tenancy.anonymous: isolated``) is no one's: nothing is kept."""
    h = Harness()
    history = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}]
    for n in range(3):
        history.append({"role": "user", "content": f"turn {n}"})
        h.send({"model": "m", "messages": history}, headers={})
    assert h.canon.memos.bodies.reused == 0 and not h.canon.memos.bodies._scopes
    for n in range(3):
        history.append({"role": "user", "content": f"again {n}"})
        h.send({"model": "m", "messages": history}, headers={"authorization": "Bearer sk-a"})
    assert h.canon.memos.bodies.reused == 2 and len(h.canon.memos.bodies._scopes) == 1


def test_a_store_given_empty_is_the_one_used() -> None:
    # An empty MemoryStore has len 0: it must not be taken for "no store given".
    store = MemoryStore(max_entries=10)
    assert Offline(load(None, env={}), store=store).s.store is store


def test_big_bodies_offloaded_while_the_loop_serves_small_ones_never_fail_open() -> None:
    """Every fourth body is big (prepared and finalized on a worker thread), every
    fourth another small but heavy (parsed by pieces on the loop, analysed on a worker
    thread), while the loop serves the small ones, sixteen requests in flight: none
    fails open.  (The
    core's own test, tests/canonicalize/test_threads.py, is the one that finds a race
    within a second; this one runs the proxy's own offloading.)"""
    offline = Offline(load(None, env={}))
    arrivals = Arrivals(2 * VARIANTS)
    roles: list[str] = []

    async def send_all() -> None:
        slots = asyncio.Semaphore(16)

        async def one(n: int) -> None:
            async with slots:
                raw = arrivals.body(n, big=n % 4 == 0, heavy=n % 4 == 2)
                flow = await offline.send(raw, headers={"authorization": f"Bearer sk-{n % 3}"})
                roles.append(flow.role)

        await asyncio.gather(*(one(n) for n in range(arrivals.requests)))

    with switching_often():
        asyncio.run(send_all())
    assert len(roles) == arrivals.requests and "fail-open" not in roles
    registry = offline.s.metrics.registry
    assert not registry.get_sample_value("prefixpin_fail_open_total", {"stage": "canonicalize"})


@pytest.mark.parametrize(
    ("shape", "heavy"),
    [
        ("one agent's system prompt", False),
        ("300 system messages", True),
        ("a system message of 300 parts", True),
        ("300 KB of dated lines", True),
        ("1,100 tools", False),
    ],
)
def test_a_body_whose_analysis_is_heavy_is_analysed_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, shape: str, heavy: bool
) -> None:
    """A body far under the size bound can still cost seconds to analyse (thousands of
    tiny system texts, hundreds of KB of dated lines): the core says so once it has split
    it (``OffLoop``) and the rest of its steps, its splice and its record run on a worker
    thread, as a big body's do; an agent's body stays on the loop, and so does one of
    many tools (~10 us each to analyse)."""
    import threading

    import canonicalize.analysis

    system: Any = "You are helpful. Today is 2026-12-02."
    tools: list[Any] = []
    if shape == "300 system messages":
        system = [{"role": "system", "content": f"rule {i}"} for i in range(300)]
    elif shape == "a system message of 300 parts":
        system = [{"type": "text", "text": f"rule {i}"} for i in range(300)]
    elif shape == "300 KB of dated lines":
        system = "\n".join(f"note {i} on 2026-12-02 13:{i % 60:02d}" for i in range(10_000))
    elif shape == "1,100 tools":
        tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {}}} for i in range(1100)]
    messages = system if isinstance(system, list) and "role" in system[0] else [{"role": "system", "content": system}]
    body = {
        "model": "m",
        "messages": [*messages, {"role": "user", "content": "hi"}],
        **({"tools": tools} if tools else {}),
    }
    raw = orjson.dumps(body)
    assert len(raw) < 1 << 20  # not a big body
    where: list[bool] = []
    real = canonicalize.analysis.prepare

    def prepare(*args: Any, **kwargs: Any) -> Any:
        where.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(canonicalize.analysis, "prepare", prepare)
    offline = Offline(load(None, env={}))
    reply = {"role": "assistant", "content": "hello"}
    sent = asyncio.run(offline.send(raw, headers={"authorization": "Bearer sk-a"}, reply=reply))
    assert sent.role == "root" and where == [not heavy] and sent.done is not None and sent.done.heavy is heavy
    assert len(offline.s.canon.memos.bodies) == (0 if heavy else 1)  # a body its worker thread reads is no other's
    body["messages"] += [reply, {"role": "user", "content": "more"}]
    again = asyncio.run(offline.send(orjson.dumps(body), headers={"authorization": "Bearer sk-a"}))
    assert again.role == "continuation" and where == [not heavy] * 2


def test_the_core_gets_the_first_value_of_each_header_it_names_and_no_other() -> None:
    offline = Offline(load(None, env={}))
    names = offline.s.canon.header_names
    assert names[0] == "x-prefixpin-parent" and {"session-id", "x-claude-code-session-id"} <= set(names)
    head = Headers(
        raw=[
            (b"authorization", b"Bearer sk-secret"),
            (b"session-id", b"first"),
            (b"x-prefixpin-parent", b"lin-1"),
            (b"session-id", b"second"),
            (b"x-other", b"1"),
        ]
    )
    wanted = frozenset(n.encode() for n in names)
    assert read_named(head, wanted) == {"session-id": "first", "x-prefixpin-parent": "lin-1"}
    assert read_named(Headers(raw=[]), wanted) == {}
