"""affinity.llama_slots against a real llama-server.

- Fixed slots without the RAM cache (``--parallel 3 --cache-ram 0``, default slot
  similarity): interleaved sessions each keep their slot, so each session's next
  turn is served from its cache.  The same sequence sent directly is printed as an
  observation only.
- llama-server's defaults (``--parallel`` auto: 4 slots on one unified KV pool, the
  RAM prompt cache): it empties idle slots and restores prompts by content, which a
  request naming a slot skips; prefixpin sees that in ``/slots`` and stops pinning,
  so ``llama_slots`` (a count, or auto) costs no cache there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.infra import sessions
from tests.infra.procs import DEFAULTS, start_llama

pytestmark = pytest.mark.e2e


def _system(session: str) -> str:
    # distinct from the first byte on, ~1.5K tokens (the tokenizer is byte-level)
    return f"[{session}] You are a coding agent for project {session}.\n" + f"Rule {session}: be exact. " * 60


def _turns(session: str, n: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    out = []
    for i in range(n):
        history = [*history, {"role": "user", "content": f"Step {i} for {session}?"}]
        out.append(
            {"model": "tiny", "max_tokens": 2, "messages": [{"role": "system", "content": _system(session)}, *history]}
        )
        history = [*history, {"role": "assistant", "content": f"Done step {i}."}]
    return out


def _run(base: str, sessions: tuple[str, ...]) -> tuple[dict[str, list[tuple[int, int]]], list[dict[str, str]]]:
    """Turn by turn, sessions interleaved: (prompt, cached) per session and turn."""
    got: dict[str, list[tuple[int, int]]] = {s: [] for s in sessions}
    headers = []
    turns = {s: _turns(s, 3) for s in sessions}
    with httpx.Client(base_url=base, timeout=120, trust_env=False, headers={"authorization": "Bearer sk-e2e"}) as c:
        for t in range(3):
            for s in sessions:
                r = c.post("/v1/chat/completions", json=turns[s][t])
                r.raise_for_status()
                usage = r.json()["usage"]
                got[s].append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
                headers.append(dict(r.headers))
    return got, headers


def _ratio(d: dict[str, list[tuple[int, int]]]) -> float:
    return sum(c for t in d.values() for _, c in t[1:]) / sum(p for t in d.values() for p, _ in t[1:])


def test_each_session_keeps_its_slot_and_its_cache(
    log_dir: Path, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proc, llama = start_llama(log_dir, parallel=3, name="llama-parallel3")
    try:
        direct, _ = _run(llama, ("alpha", "bravo", "charlie"))
        proxy = serve(llama, write_config({"affinity": {"llama_slots": 3}}))
        # new sessions (different text): the direct run's caches do not help them
        pinned, headers = _run(proxy, ("delta", "echo", "foxtrot"))
    finally:
        proc.stop()
    assert httpx.get(proxy + "/readyz", trust_env=False, timeout=10).json()["llama_slots"]["pinning"] == "all"
    slots = [h["x-prefixpin-slot"] for h in headers]
    assert slots[:3] == slots[3:6] == slots[6:9] and len(set(slots[:3])) == 3
    for s, turns in pinned.items():
        for prompt, cached in turns[1:]:
            assert cached >= 0.8 * prompt, (s, turns)
    print(
        f"\nlater turns cached: direct {_ratio(direct):.2f}, through prefixpin with llama_slots 3 {_ratio(pinned):.2f}"
    )


def test_on_llama_servers_defaults_llama_slots_costs_no_cache(
    log_dir: Path, serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """Three interleaved sessions of a pre-fix hermes agent, one request at a time, each
    setup on a fresh default llama-server: without llama_slots, with 4, with auto."""
    ids, turns = sessions.session_ids(3), 10
    got: dict[str, list[sessions.Sent]] = {}
    ready: dict[str, Any] = {}
    for name, affinity in (("off", {}), ("4", {"llama_slots": 4}), ("auto", {"llama_slots": "auto"})):
        proc, llama = start_llama(log_dir, ctx=sessions.ctx_for(turns), name=f"llama-defaults-{name}", **DEFAULTS)
        try:
            proxy = serve(llama, write_config({"affinity": affinity}))
            got[name] = sessions.run(proxy, ids, turns)
            ready[name] = httpx.get(proxy + "/readyz", trust_env=False, timeout=10).json().get("llama_slots")
        finally:
            proc.stop()
    off = sessions.ratio(got["off"])
    print(f"\ncached on llama-server's defaults: without llama_slots {off:.3f}", end="")
    for name in ("4", "auto"):
        print(f", llama_slots {name} {sessions.ratio(got[name]):.3f}", end="")
        assert sessions.ratio(got[name]) >= 0.98 * off, (name, sessions.ratio(got[name]), off)
        # the fresh server was probed before the first request: nothing is ever pinned
        pinned = [i for i, s in enumerate(got[name]) if "x-prefixpin-slot" in s.headers]
        assert pinned == [], pinned
        assert ready[name]["pinning"] == "none", ready[name]
        assert "clears idle slots" in ready[name]["why"], ready[name]
    assert ready["auto"]["slots"] == 4  # /props' total_slots: --parallel auto
    print()
