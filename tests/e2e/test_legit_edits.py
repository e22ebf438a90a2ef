"""Legitimate edits through the real ``prefixpin serve`` with ``learn: pin``: every
request of tests/e2e/data/legit_edits.json (an instruction's number changed once, a
version bumped, a line added to a listing, a paragraph edited, a date or a version
in the user's task, the same edit in two sessions) reaches the upstream byte for
byte as the client sent it, and no learned rule is named."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import Recorder, track

pytestmark = pytest.mark.e2e

CORPUS = Path(__file__).parent / "data" / "legit_edits.json"


def test_legitimate_edits_reach_the_upstream_as_sent(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    cases = json.loads(CORPUS.read_text())["cases"]
    proxy = serve(recorder.base, write_config({"canonicalize": {"learn": "pin"}}))
    client = track(httpx.Client(base_url=proxy, trust_env=False, timeout=30))
    sent: list[tuple[str, bytes]] = []
    learned: list[tuple[str, str]] = []
    recorder.reset()
    for case in cases:
        for request in case["requests"]:
            raw = orjson.dumps(request["body"])
            recorder.control(content=request["reply"])
            headers = {"authorization": f"Bearer {case['tenant']}", "content-type": "application/json"}
            resp = client.post("/v1/chat/completions", content=raw, headers=headers)
            assert resp.status_code == 200, resp.text
            sent.append((case["name"], raw))
            names = resp.headers.get("x-prefixpin-rewrites", "")
            learned += [(case["name"], n) for n in names.split(",") if n.startswith("learned.")]
    received = recorder.bodies()
    assert len(received) == len(sent)
    changed = [name for (name, raw), got in zip(sent, received, strict=True) if got != raw]
    assert changed == [] and learned == []
