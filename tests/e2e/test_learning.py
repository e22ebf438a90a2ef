"""Learning through the real ``prefixpin serve`` in front of the recording upstream:
agents no pack knows (tests.infra.unknown_agents) on the three wire APIs,
streamed and not, each request answered with the reply the agent then replays
(as a real agent would).  With ``learn: pin`` the upstream receives what a fixed
agent sends, but for a counter's first change; with ``suggest`` it receives what ``off`` forwards, byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Recorder, track
from tests.infra import unknown_agents as ua

pytestmark = pytest.mark.e2e

SPEC = ua.Spec(sessions=2, turns=5, seed=5)


def _reply_text(line: dict[str, Any]) -> dict[str, Any]:
    """How the recorder must answer ``line`` for the agent's next request to replay it."""
    resp = line["response"]
    if resp.get("tool_calls"):
        call = resp["tool_calls"][0]["function"]
        return {"tool_calls": [{"name": call["name"], "arguments": call["arguments"]}]}
    if "output" in resp:
        return {"content": resp["output"][0]["content"][0]["text"]}
    content = resp["content"]
    return {"content": content if isinstance(content, str) else content[0]["text"]}


def _drive(proxy: str, recorder: Recorder, lines: list[dict[str, Any]]) -> list[httpx.Response]:
    client = track(httpx.Client(base_url=proxy, trust_env=False, timeout=30))
    out = []
    for line in lines:
        recorder.control(**_reply_text(line))
        resp = client.post(line["path"], json=line["body"], headers=line["headers"])
        assert resp.status_code == 200, resp.text
        resp.read()
        out.append(resp)
    return out


def _metric(proxy: str, series: str) -> float:
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(series))


def test_pin_sends_the_upstream_what_a_fixed_agent_would(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    lines = ua.generate(SPEC)
    for agent in ("atlas", "quill", "relay"):  # every wire API, streamed and not
        assert {line["body"]["stream"] for line in lines if line["agent"] == agent} == {True, False}
    proxy = serve(recorder.base, write_config({"canonicalize": {"learn": "pin"}}))
    answers = _drive(proxy, recorder, lines)
    received = [r["body"] for r in recorder.requests()]
    score = ua.score(lines, received)
    assert score.leaks == 0 and score.edits and score.edits_pinned == 0
    # A counter's first change reaches the upstream (one change is no evidence); every
    # other value is pinned: what a prefix cache serves is >= 95% of a fixed agent's.
    assert score.kept >= 0.95, score.misses
    roles = [r.headers["x-prefixpin-role"] for r in answers]
    assert roles.count("root") == len({line["session"] for line in lines})
    rewrites = {name for r in answers for name in r.headers.get("x-prefixpin-rewrites", "").split(",") if name}
    assert {"learned.time", "learned.uuid", "learned.counter", "learned.hex_id"} <= rewrites
    for cls in ("time", "uuid", "counter", "hex_id"):
        assert _metric(proxy, f'prefixpin_learned_spans_total{{class="{cls}"}}') > 0
    assert _metric(proxy, 'prefixpin_rewrites_total{rule="learned.uuid"}') > 0


def test_suggest_forwards_every_byte_as_off_does(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    lines = ua.generate(ua.Spec(sessions=1, turns=4, seed=6))
    received: dict[str, list[bytes]] = {}
    roles: dict[str, list[str]] = {}
    for mode in ("off", "suggest"):
        proxy = serve(recorder.base, write_config({"canonicalize": {"learn": mode}}))
        recorder.reset()
        answers = _drive(proxy, recorder, lines)
        received[mode] = [r["body"] for r in recorder.requests()]
        roles[mode] = [r.headers["x-prefixpin-role"] for r in answers]
        if mode == "suggest":
            assert _metric(proxy, 'prefixpin_learned_spans_total{class="uuid"}') > 0
    assert received["suggest"] == received["off"]
    assert roles["suggest"] == roles["off"]
    # What a client sent reaches the upstream as sent (a streamed chat request is asked for usage).
    for line, body in zip(lines, received["suggest"], strict=True):
        if not (line["agent"] == "atlas" and line["body"]["stream"]):
            assert ua.system_texts(line["agent"], body) == ua.system_texts(line["agent"], line["body"])
