"""``prefixpin replay`` as a user runs it: a subprocess against real upstreams
(the recording upstream, and a real ``prefixpin serve`` in front of it)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Recorder
from tests.infra.procs import closed_port, free_port, prefixpin_argv

SYSTEM = "You are Hermes.\nSession ID: 20260513_204511_d02a5d"


def body(*users: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i, u in enumerate(users):
        if i:
            msgs.append({"role": "assistant", "content": f"answer {i}"})
        msgs.append({"role": "user", "content": u})
    return {"model": "m", "messages": msgs, "stream": stream, **extra}


@pytest.fixture
def trace(tmp_path: Path) -> Callable[..., Path]:
    def write(*lines: dict[str, Any] | str) -> Path:
        path = tmp_path / f"trace-{free_port()}.jsonl"
        path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
        return path

    return write


def replay(path: Path, upstream: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*prefixpin_argv(), "replay", str(path), "--upstream", upstream, "--no-progress", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def replay_json(path: Path, upstream: str, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = replay(path, upstream, "--json", *args)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_counts_prompt_cached_processed_per_request_and_in_total(recorder: Recorder, trace) -> None:
    recorder.control(usage={"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 60}})
    path = trace(
        {"t": 0, "headers": {}, "body": body("hi"), "kind": "root", "session": "s1"},
        {"t": 1, "headers": {}, "body": body("hi", "more"), "kind": "fork", "session": "s1", "extra": [1]},
    )
    code, out, _ = replay_json(path, recorder.base)
    assert code == 0
    assert [(r["line"], r["kind"], r["session"]) for r in out["requests"]] == [
        (1, "root", "s1"),
        (2, "fork", "s1"),
    ]
    for r in out["requests"]:
        assert (r["status"], r["prompt"], r["cached"], r["processed"], r["ok"]) == (200, 100, 60, 40, True)
        assert r["role"] is None  # direct: no prefixpin to name one
        assert r["wall_s"] > 0
    total = out["total"]
    assert (total["requests"], total["prompt_tokens"], total["cached_tokens"], total["processed_tokens"]) == (
        2,
        200,
        120,
        80,
    )
    assert total["cached_ratio"] == pytest.approx(0.6)
    assert out["by_kind"]["fork"]["prompt_tokens"] == 100
    assert (out["upstream"], out["via"], out["target"]) == (recorder.base, None, recorder.base)
    sent = [json.loads(b) for b in recorder.bodies()]
    assert [s["messages"][-1]["content"] for s in sent] == ["hi", "more"]


def test_sends_the_trace_headers_and_adds_the_api_key_only_when_absent(recorder: Recorder, trace) -> None:
    path = trace(
        {"headers": {"X-Agent": "hermes", "Content-Length": "999"}, "body": body("a")},
        {"headers": {"Authorization": "Bearer mine"}, "body": body("b")},
    )
    code, _, _ = replay_json(path, recorder.base, "--api-key", "sk-test")
    assert code == 0
    first, second = (r["headers"] for r in recorder.requests())
    assert first["x-agent"] == "hermes"
    assert first["authorization"] == "Bearer sk-test"
    assert first["content-length"] != "999"  # the recorded length is not this request's
    assert second["authorization"] == "Bearer mine"


def test_streams_always_ask_for_usage(recorder: Recorder, trace) -> None:
    recorder.control(content="hello there", usage={"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 49}})
    path = trace({"body": body("hi", stream=True)}, {"body": body("hi", stream=True, stream_options={"x": 1})})
    code, out, _ = replay_json(path, recorder.base)
    assert code == 0
    assert [(r["prompt"], r["cached"], r["processed"]) for r in out["requests"]] == [(50, 49, 1)] * 2
    sent = [json.loads(b) for b in recorder.bodies()]
    assert sent[0]["stream_options"] == {"include_usage": True}
    assert sent[1]["stream_options"] == {"x": 1, "include_usage": True}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"input_tokens": 10, "cache_read_input_tokens": 80, "cache_creation_input_tokens": 10}, (100, 80)),
        ({"prompt_tokens": 90, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 26}, (90, 64)),
    ],
    ids=["anthropic", "deepseek"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_reads_every_usage_shape(recorder: Recorder, trace, usage, expected, stream: bool) -> None:
    recorder.control(usage=usage)
    code, out, _ = replay_json(trace({"body": body("hi", stream=stream)}), recorder.base)
    assert code == 0
    assert (out["requests"][0]["prompt"], out["requests"][0]["cached"]) == expected


def test_malformed_lines_are_reported_with_their_number_and_skipped(recorder: Recorder, trace) -> None:
    path = trace(
        {"body": body("a")},
        "{not json",
        "",
        {"headers": {}, "nobody": True},
        {"body": body("b"), "t": "soon"},
        {"body": body("c")},
    )
    code, out, err = replay_json(path, recorder.base)
    assert code == 0
    assert f"{path}:2: skipped: not JSON" in err
    assert f'{path}:4: skipped: "body" is missing' in err
    assert f'{path}:5: skipped: "t" is not a number' in err
    assert [r["line"] for r in out["requests"]] == [1, 6]
    assert [s["line"] for s in out["skipped_lines"]] == [2, 4, 5]
    assert len(recorder.bodies()) == 2


def test_failures_are_reported_counted_and_exit_non_zero(recorder: Recorder, trace) -> None:
    recorder.control(status=500)
    path = trace({"body": body("a")}, {"body": body("b", stream=True)})
    code, out, _ = replay_json(path, recorder.base)
    assert code == 1
    assert len(recorder.bodies()) == 2  # it kept going, and a 500 is not tried again
    assert [(r["status"], r["ok"]) for r in out["requests"]] == [(500, False)] * 2
    assert "told to fail" in out["requests"][0]["error"]
    assert out["total"]["failed"] == 2


def test_gateway_errors_are_retried_like_an_sdk_would_and_reported(recorder: Recorder, trace) -> None:
    recorder.control(status=502)
    code, out, _ = replay_json(trace({"body": body("a")}), recorder.base)
    assert code == 1
    assert len(recorder.bodies()) == 3  # three tries in all
    (r,) = out["requests"]
    assert (r["status"], r["ok"], len(r["retried"])) == (502, False, 2)
    assert all(e.startswith("HTTP 502") for e in r["retried"])
    assert out["total"]["retried"] == 2
    text = replay(trace({"body": body("a")}), recorder.base).stdout
    assert "line 1: retried after: HTTP 502" in text


def test_an_unreachable_upstream_is_a_failure_per_request(trace) -> None:
    with closed_port() as port:
        code, out, _ = replay_json(trace({"body": body("a")}, {"body": body("b")}), f"http://127.0.0.1:{port}")
    assert code == 1
    assert [r["status"] for r in out["requests"]] == [None, None]
    assert all("ConnectError" in r["error"] and len(r["retried"]) == 2 for r in out["requests"])


def test_a_missing_trace_exits_2(tmp_path: Path) -> None:
    proc = replay(tmp_path / "nope.jsonl", "http://127.0.0.1:9")
    assert proc.returncode == 2
    assert "cannot read trace" in proc.stderr


def test_text_report_has_annotations_roles_and_totals(recorder: Recorder, trace) -> None:
    recorder.control(usage={"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 5}})
    path = trace({"body": body("a"), "kind": "root", "session": "s1"}, {"body": body("a", "b"), "kind": "turn"})
    proc = replay(path, recorder.base)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("#"))
    assert header.split()[:4] == ["#", "line", "kind", "session"]
    assert header.split()[4:] == ["role", "status", "prompt", "cached", "processed", "hit", "wall_s"]
    assert any(ln.startswith("all") and "50.0%" in ln for ln in lines)
    assert any(ln.startswith("kind=turn") for ln in lines)


def test_via_prefixpin_reports_roles_and_usage_of_streams(recorder: Recorder, serve, trace) -> None:
    proxy = serve(recorder.base)
    recorder.control(usage={"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 30}})
    key = {"Authorization": "Bearer sk-replay"}  # without a key each request would be its own tenant
    path = trace(
        {"headers": key, "body": body("hello", stream=True), "kind": "root"},
        {"headers": key, "body": body("hello", "again", stream=True), "kind": "turn"},
    )
    code, out, _ = replay_json(path, "http://127.0.0.1:9", "--via", proxy)
    assert code == 0
    assert (out["target"], out["via"], out["upstream"]) == (proxy, proxy, "http://127.0.0.1:9")
    assert [r["role"] for r in out["requests"]] == ["root", "continuation"]
    assert [(r["prompt"], r["cached"]) for r in out["requests"]] == [(40, 30)] * 2
    assert out["by_role"]["continuation"]["requests"] == 1
    sent = [json.loads(b) for b in recorder.bodies()]
    assert all(s["stream_options"] == {"include_usage": True} for s in sent)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_responses_lines_go_to_their_path_through_prefixpin(
    recorder: Recorder, serve: Callable[..., str], trace, stream: bool
) -> None:
    proxy = serve(recorder.base)
    recorder.control(cached=4)
    req = {"model": "m", "instructions": "Be brief.", "input": "hi", "stream": stream}
    path = trace({"t": 0, "headers": {}, "path": "/v1/responses", "body": req})
    code, out, err = replay_json(path, recorder.base, "--via", proxy)
    assert code == 0, err
    (r,) = out["requests"]
    assert (r["status"], r["cached"], r["role"]) == (200, 4, "root")
    assert r["prompt"] > 0
    assert [json.loads(b) for b in recorder.bodies("/v1/responses")] == [req]
