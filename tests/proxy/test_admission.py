"""Admission past ``limits.max_concurrency``, served by prefixpin's own server:
every route refused the same way, a 503 with Retry-After in the OpenAI shape."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from tests.infra.wait import wait_until
from tests.proxy.test_watch import SlowUpstream, served


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"], ids=["exchange", "passthrough"])
def test_a_request_past_the_limit_is_503_on_every_route(path: str, tmp_path: Path) -> None:
    """... and recorded with ``trace.path`` when it is on a wire route (no body: it was
    refused before its body was read)."""
    slow = SlowUpstream()
    trace = tmp_path / "trace.jsonl"
    try:
        with served(slow.up.url, limits={"max_concurrency": 1}, trace={"path": str(trace)}) as base:

            def hold() -> None:  # takes the one slot: the upstream answers it after 10 s
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(base + path, content=b'{"user": "slow"}', timeout=1.5)

            holder = threading.Thread(target=hold)
            holder.start()
            wait_until(lambda: slow.up.requests, timeout=5, message="the first request is in flight")
            r = httpx.post(base + path, json={"model": "m", "messages": []}, timeout=5)
            holder.join()
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "overloaded"
    finally:
        slow.up.close()
    lines = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    rejected = [(x["status"], x["path"], x["body"]) for x in lines if x["role"] == "rejected"]
    assert rejected == ([(503, path, None)] if path == "/v1/chat/completions" else [])
