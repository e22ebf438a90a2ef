"""prefixpin_uncached_tokens_total{cause}, in-process: a scripted upstream reports
usage, and the causes sum to prompt minus cached request by request."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import orjson
from starlette.testclient import TestClient

from canonicalize import UNCACHED_CAUSES
from proxy.app import create_app
from proxy.config import load

SYSTEM = "You are a careful coding agent. Read before you write. " * 30
KEY = {"authorization": "Bearer sk-measure"}


class Scripted:
    """Answers each request with the next (prompt, cached) usage."""

    def __init__(self, usages: list[tuple[int, int]]) -> None:
        self.usages = list(usages)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        prompt, cached = self.usages.pop(0)
        usage = {"prompt_tokens": prompt, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}}
        message = {"role": "assistant", "content": "ok"}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message}], "usage": usage})


def body(history: list[dict[str, Any]], system: str = SYSTEM) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, *history]}


def uncached(client: TestClient, requests: int) -> dict[str, float]:
    """The family once the counting hooks of ``requests`` requests ran (they may run late)."""
    deadline = time.monotonic() + 10
    while True:
        text = client.get("/metrics").text
        done = sum(float(v) for v in re.findall(r'^prefixpin_requests_total\{.*route="chat.*?\} (\S+)', text, re.M))
        if done >= requests or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    found = re.findall(r'^prefixpin_uncached_tokens_total\{cause="(\w+)"\} (\S+)', text, re.M)
    return {cause: float(v) for cause, v in found}


def test_every_cause_starts_at_zero() -> None:
    app = create_app(load(None, env={}), transport=httpx.MockTransport(Scripted([])))
    with TestClient(app) as client:
        assert uncached(client, 0) == dict.fromkeys(UNCACHED_CAUSES, 0.0)


def test_causes_sum_to_prompt_minus_cached_with_an_eviction_and_a_break() -> None:
    usages = [(1000, 0), (1030, 1000), (1060, 0), (1090, 30)]
    app = create_app(load(None, env={}), transport=httpx.MockTransport(Scripted(usages)))
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix the flaky test"}]
    with TestClient(app) as client:

        def send(b: dict[str, Any]) -> str:
            r = client.post("/v1/chat/completions", content=orjson.dumps(b), headers=KEY)
            assert r.status_code == 200
            history.append(r.json()["choices"][0]["message"])
            return r.headers["x-prefixpin-role"]

        assert send(body(history)) == "root"  # all new
        history.append({"role": "user", "content": "go on"})
        assert send(body(history)) == "continuation"  # it hit: new only
        history.append({"role": "user", "content": "and then?"})
        assert send(body(history)) == "continuation"  # the upstream lost the prefix: evicted
        after = uncached(client, 3)
        assert after["evicted"] > 900
        assert sum(after.values()) == 1000 + 30 + 1060
        history.append({"role": "user", "content": "thanks"})
        edited = SYSTEM.replace("careful", "meticulous", 1)  # early in the prompt: most of it breaks
        send(body(history, system=edited))
        final = uncached(client, 4)
    assert sum(final.values()) == sum(p - c for p, c in usages)
    assert final["system_changed"] > 900
    assert final["new"] >= 1000 + 30
    assert set(final) == set(UNCACHED_CAUSES)


def test_a_request_with_nothing_cached_still_has_its_token_series() -> None:
    """Zero cached and cache-write tokens are not added (an inc takes a lock), but the
    series of the request's model and role exist, at 0, for dashboards and rate()."""
    app = create_app(load(None, env={}), transport=httpx.MockTransport(Scripted([(1000, 0)])))
    with TestClient(app) as client:
        r = client.post(
            "/v1/chat/completions", content=orjson.dumps(body([{"role": "user", "content": "hi"}])), headers=KEY
        )
        assert r.status_code == 200
        uncached(client, 1)  # (the counting hooks ran)
        text = client.get("/metrics").text
    labels = '{model="m",role="root"}'
    assert f"prefixpin_prompt_tokens_total{labels} 1000.0" in text
    assert f"prefixpin_cached_tokens_total{labels} 0.0" in text
    assert f"prefixpin_cache_write_tokens_total{labels} 0.0" in text
