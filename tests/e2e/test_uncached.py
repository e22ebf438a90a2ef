"""prefixpin_uncached_tokens_total{cause} through a real llama-server whose one slot
keeps no prompt in RAM (``--parallel 1 --cache-ram 0``: the session fixture): a
second conversation in between evicts the first one's prefix, and the next turn
of the first is counted ``evicted``; an edited system prompt is
``system_changed``.  Request by request the causes sum to what the client saw:
prompt minus cached tokens.  No prompt text reaches the metrics or the log.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from canonicalize import UNCACHED_CAUSES
from tests.infra.procs import Proc, start_prefixpin

pytestmark = pytest.mark.e2e

MARKER = "zebra-quartz-7"  # a word that is only in the prompts
SYSTEM_A = f"You are Atlas, a careful coding agent ({MARKER}). " + "Read the code before you change it. " * 60
SYSTEM_B = "You are Juniper, a travel planner. " + "Check opening hours before you plan a visit. " * 60


@pytest.fixture
def proxy(llama_server: str, log_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Proc]]:
    config = tmp_path / "debug.yaml"
    config.write_text(yaml.safe_dump({"log": {"level": "debug"}}))
    proc, base = start_prefixpin(
        log_dir, upstream=llama_server, config=config, name=f"prefixpin-uncached-{tmp_path.name}"
    )
    try:
        yield base, proc
    finally:
        proc.stop()


def _metrics(base: str, requests: int) -> tuple[dict[str, float], str]:
    """The family once ``requests`` answered requests were counted (counting may run late)."""
    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(base + "/metrics", trust_env=False, timeout=10).text
        done = sum(float(v) for v in re.findall(r'^prefixpin_requests_total\{.*route="chat.*?\} (\S+)', text, re.M))
        if done >= requests or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    found = re.findall(r'^prefixpin_uncached_tokens_total\{cause="(\w+)"\} (\S+)', text, re.M)
    return {cause: float(v) for cause, v in found}, text


def test_eviction_mid_conversation_is_counted_evicted(proxy: tuple[str, Proc]) -> None:
    base, proc = proxy
    client = httpx.Client(base_url=base, trust_env=False, timeout=120, headers={"authorization": "Bearer sk-evict"})
    seen: list[tuple[int, int]] = []  # (prompt, cached) as the client saw them

    def chat(system: str, history: list[dict[str, Any]]) -> str:
        body = {"model": "tiny", "messages": [{"role": "system", "content": system}, *history], "max_tokens": 4}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        seen.append((usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
        history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})
        return r.headers["x-prefixpin-role"]

    a: list[dict[str, Any]] = [{"role": "user", "content": "Find the flaky test."}]
    b: list[dict[str, Any]] = [{"role": "user", "content": "Plan a day in Lisbon."}]
    with client:
        assert chat(SYSTEM_A, a) == "root"
        a.append({"role": "user", "content": "Run it ten times."})
        assert chat(SYSTEM_A, a) == "continuation"
        hit = seen[-1]
        assert hit[1] > 0.9 * len(SYSTEM_A), f"the slot kept A's prefix: {seen}"
        counted, _ = _metrics(base, 2)
        assert counted["evicted"] == 0, counted

        assert chat(SYSTEM_B, b) == "root"  # the one slot now holds B
        a.append({"role": "user", "content": "Now fix it."})
        assert chat(SYSTEM_A, a) == "continuation"
        evicted_turn = seen[-1]
        assert evicted_turn[1] < 0.1 * evicted_turn[0], f"B evicted A's prefix: {seen}"
        counted, _ = _metrics(base, 4)
        assert counted["evicted"] > 0.8 * len(SYSTEM_A), counted
        assert sum(counted.values()) == sum(p - c for p, c in seen)

        a.append({"role": "user", "content": "And add a test."})
        edited = SYSTEM_A.replace("careful", "meticulous", 1)  # near the start: most of the prompt breaks
        chat(edited, a)
        counted, text = _metrics(base, 5)
    assert set(counted) == set(UNCACHED_CAUSES)
    assert sum(counted.values()) == sum(p - c for p, c in seen)
    assert counted["system_changed"] > 0.8 * len(SYSTEM_A), counted
    assert counted["new"] > 0
    assert 'prefixpin_prefix_breaks_total{cause="system_changed"} 1.0' in text
    assert MARKER not in text
    assert MARKER not in proc.log_path.read_text(errors="replace")


def test_a_short_conversations_eviction_is_counted_too(proxy: tuple[str, Proc]) -> None:
    """No system prompt, a few words a turn: the eviction is tens of tokens, still counted."""
    base, _ = proxy
    client = httpx.Client(base_url=base, trust_env=False, timeout=120, headers={"authorization": "Bearer sk-short"})
    seen: list[tuple[int, int]] = []

    def chat(history: list[dict[str, Any]]) -> None:
        r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": history, "max_tokens": 3})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        seen.append((usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
        history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})

    a: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    with client:
        chat(a)
        a.append({"role": "user", "content": "more"})
        chat(a)
        chat([{"role": "user", "content": "bonjour"}])  # takes the one slot
        a.append({"role": "user", "content": "again"})
        chat(a)
        counted, _ = _metrics(base, 4)
    assert sum(counted.values()) == sum(p - c for p, c in seen)
    assert counted["evicted"] > 0, (seen, counted)
