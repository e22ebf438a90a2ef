"""Recording live traffic, end to end: ``prefixpin serve --trace`` in front of a
scripted provider cache that reports usage (``tests/infra/provider.py``, one
machine: what a conversation sent stays cached until its clock moves on), a trace
replayed through it by ``prefixpin replay --via``, then ``prefixpin audit`` on the
recorded file.

The audit names, request by request, the roles the proxy gave, and in total the
same uncached tokens by cause as the live ``prefixpin_uncached_tokens_total``
(breaks of every cause, and ``evicted`` after the provider's cache expired mid-way).
No credential reaches the file; the access log explains each miss without prompt
text.  With several workers (``listen.workers``), every line is whole and every
body is the client's bytes, across rotations.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import bench_attribution, traces
from tests.conftest import track
from tests.infra.procs import Proc, free_port, prefixpin_argv
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e
SECRETS = ("hermes-bench", "Bearer bench", "sk-replay-key")


@pytest.fixture
def provider(log_dir: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.infra.provider", "--port", str(port), "--machines", "1"]
    proc = Proc(f"provider-{port}", argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(base + "/health")
        yield base
    finally:
        proc.stop()


@pytest.fixture
def serve_traced(log_dir: Path) -> Iterator[Callable[..., tuple[str, Proc]]]:
    """``prefixpin serve --trace PATH``; stopped after the test."""
    procs: list[Proc] = []

    def start(upstream: str, trace: Path, config: Path) -> tuple[str, Proc]:
        port = free_port()
        argv = [*prefixpin_argv(), "serve", "--upstream", upstream, "--port", str(port), "--trace", str(trace)]
        proc = Proc(f"prefixpin-trace-{port}", [*argv, "--config", str(config)], log_dir, env={"PYTHONUNBUFFERED": "1"})
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(base + "/healthz", timeout=60)
        return base, proc

    yield start
    for proc in procs:
        proc.stop()


def _samples(base: str, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(base + "/metrics", trust_env=False, timeout=10).text
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _metric(base: str, name: str, label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in _samples(base, name)}


def _answered(base: str) -> float:
    return sum(v for labels, v in _samples(base, "prefixpin_requests_total") if labels["route"] != "passthrough")


def _lines(path: Path) -> list[bytes]:
    """The file's lines; none when it is not there, or was rotated away since it was
    listed (its lines are then counted under its new name at the next look)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [line for line in data.split(b"\n") if line]


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _replay(trace: Path, upstream: str, via: str) -> None:
    argv = [*prefixpin_argv(), "replay", str(trace), "--upstream", upstream, "--via", via, "--no-progress", "--json"]
    out = subprocess.run([*argv, "--api-key", "sk-replay-key"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all(r["status"] == 200 for r in json.loads(out.stdout)["requests"]), out.stdout[-3000:]


def _agent_traffic() -> list[dict[str, Any]]:
    """A hermes session as hermes sends it (a review fork, a minute and a memory counter
    prefixpin pins) and conversations with one injected change of each cause, two
    tenants; one line without credentials (replay's key) and one bypassed."""
    pre, _ = traces.generate(traces.SMOKE)
    lines = [*pre, *bench_attribution.generate(bench_attribution.Spec(4, 5, 0.5, seed=3))]
    lines[3] = {**lines[3], "headers": {}}  # replay sends it with --api-key: a third tenant
    lines[5] = {**lines[5], "headers": {**lines[5]["headers"], "x-prefixpin-bypass": "1"}}
    return lines


def test_the_audit_of_a_recording_names_what_the_live_counter_counted(
    tmp_path: Path, log_dir: Path, provider: str, serve_traced: Callable[..., tuple[str, Proc]]
) -> None:
    config = tmp_path / "prefixpin.yaml"
    config.write_text(yaml.safe_dump({"log": {"access": True}}))
    recorded = tmp_path / "recorded.jsonl"
    base, proc = serve_traced(provider, recorded, config)
    sent = _agent_traffic()
    half = len(sent) // 2
    _replay(_write(tmp_path / "first.jsonl", sent[:half]), provider, base)
    httpx.post(provider + "/_clock", json={"advance": 3600}, trust_env=False).raise_for_status()  # it forgets all
    _replay(_write(tmp_path / "second.jsonl", sent[half:]), provider, base)

    wait_until(lambda: _answered(base) == len(sent), message="every request counted")
    wait_until(lambda: len(_lines(recorded)) == len(sent), message="every request recorded")
    live = {k: v for k, v in _metric(base, "prefixpin_uncached_tokens_total", "cause").items() if v}
    assert _metric(base, "prefixpin_fail_open_total", "stage")["trace"] == 0

    out = subprocess.run(
        [*prefixpin_argv(), "audit", str(recorded), "--config", str(config), "--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["malformed_lines"] == []
    lines = [json.loads(line) for line in _lines(recorded)]
    assert [r["role"] for r in report["requests"]] == [line["role"] for line in lines]
    assert [r["index"] for r in report["requests"]] == list(range(len(sent)))
    audited: Counter[str] = Counter()
    for r in report["requests"]:
        audited.update(r["uncached"] or {})
    assert dict(audited) == live, (dict(audited), live)
    assert live["evicted"] > 0 and live["new"] > 0
    assert {"system_changed", "tools_changed", "history_rewritten"} <= set(live), live
    roles = Counter(line["role"] for line in lines)
    assert roles["fork"] >= 1 and roles["continuation"] >= 5 and roles["bypass"] == 1, roles

    text = recorded.read_text()
    assert not any(secret in text for secret in SECRETS)
    assert len({line["tenant"] for line in lines if line["role"] != "bypass"}) == 3
    assert all(line["status"] == 200 for line in lines)
    assert all(line["usage"]["prompt_tokens"] > 0 for line in lines if line["role"] != "bypass")  # read, not bypassed

    # The access log explains each miss: role, lineage, tokens, cause; no prompt text.
    access = [ln for ln in proc.log_path.read_text().splitlines() if '"POST /v1/chat/completions' in ln]
    assert len(access) == len(sent)
    read = [ln for ln in access if "role=bypass" not in ln]
    assert len(read) == len(sent) - 1 and any(ln.endswith(" 200 role=bypass lineage=-") for ln in access)
    assert all(re.search(r" 200 role=[\w-]+ lineage=\w+ prompt=\d+ cached=\d+", ln) for ln in read), read[:3]
    causes = Counter(m.group(1) for ln in access if (m := re.search(r" cause=(\S+)", ln)))
    assert causes["evicted"] >= 1 and causes["system_changed"] >= 1, causes
    log = proc.log_path.read_text()
    assert not any(secret in log for secret in SECRETS)
    assert "Hermes Agent" in text and "Hermes Agent" not in log  # prompt text: in the trace only


def _clients_on_each_worker(base: str, per_worker: int) -> list[httpx.Client]:
    """Keep-alive clients, ``per_worker`` on each of the two workers (``/healthz`` names
    the process behind a connection; the kernel picks it)."""
    held: dict[int, list[httpx.Client]] = {}
    for _ in range(400):
        client = track(
            httpx.Client(base_url=base, trust_env=False, timeout=120, limits=httpx.Limits(max_connections=1))
        )
        pid = int(client.get("/healthz").json()["pid"])
        if len(held.setdefault(pid, [])) < per_worker:
            held[pid].append(client)
        else:
            client.close()
        if len(held) == 2 and all(len(c) == per_worker for c in held.values()):
            return [c for clients in held.values() for c in clients]
    raise AssertionError(f"400 connections did not reach both workers {per_worker} times: {list(held)}")


def _hammer(clients: list[httpx.Client], bodies: list[bytes]) -> list[int]:
    """Every body sent, the clients at once (each its share, in turn)."""
    statuses: list[int] = []
    chunks = [bodies[i :: len(clients)] for i in range(len(clients))]

    def send(client: httpx.Client, chunk: list[bytes]) -> None:
        for body in chunk:
            r = client.post("/v1/chat/completions", content=body, headers={"authorization": "Bearer sk-w"})
            statuses.append(r.status_code)

    threads = [threading.Thread(target=send, args=(c, chunk)) for c, chunk in zip(clients, chunks, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_several_workers_write_whole_lines_across_rotations(
    tmp_path: Path, provider: str, serve_traced: Callable[..., tuple[str, Proc]], redis_proc: Callable[..., Any]
) -> None:
    """Bodies of 50-150 KB (far past PIPE_BUF and a pipe's 64 KiB), sent by 6 clients at
    once, 3 on each of 2 workers, the file rotating every ~1 MB: every line is whole,
    every body is the one sent."""
    _, redis_url = redis_proc()
    config = tmp_path / "workers.yaml"
    max_bytes = 1 << 20
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"workers": 2},
                "store": {"backend": "redis", "redis_url": redis_url},
                "trace": {"max_bytes": max_bytes, "keep": 100},
            }
        )
    )
    recorded = tmp_path / "w.jsonl"
    base, _ = serve_traced(provider, recorded, config)
    bodies = []
    for i in range(48):
        filler = f"request {i} " + "lorem ipsum dolor sit amet " * (2000 + 400 * (i % 10))
        body = {"model": "m", "messages": [{"role": "user", "content": filler}], "temperature": 0.50, "n": 1e0}
        bodies.append(json.dumps(body).encode())
    assert all(s == 200 for s in _hammer(_clients_on_each_worker(base, 3), bodies))

    def files() -> list[Path]:
        return sorted(tmp_path.glob("w.jsonl*"))

    wait_until(lambda: sum(len(_lines(f)) for f in files()) == len(bodies), message="every request recorded")
    assert len(files()) > 3, "the file rotated"
    seen = []
    for f in files():
        assert f.stat().st_size <= max_bytes
        for line in _lines(f):
            obj = json.loads(line)  # whole: no line torn or interleaved with another
            start = line.index(b',"body":') + len(b',"body":')
            seen.append(line[start:-1])
            assert obj["role"] == "root" and obj["status"] == 200
    assert sorted(seen) == sorted(bodies)  # the client's bytes (1e0 and 0.50 as sent)


def test_a_full_disk_fails_no_request(
    tmp_path: Path, provider: str, serve_traced: Callable[..., tuple[str, Proc]]
) -> None:
    """``/dev/full``: every write fails (ENOSPC); every request is served, every lost
    line counted, and the failure logged as a warning, not per request."""
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    base, proc = serve_traced(provider, Path("/dev/full"), config)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=base, trust_env=False, timeout=60, headers={"authorization": "Bearer sk-f"}) as client:
        for _ in range(5):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    wait_until(lambda: _metric(base, "prefixpin_fail_open_total", "stage")["trace"] == 5, message="5 lines lost")
    log = proc.log_path.read_text()
    assert log.count("not recorded") == 1 and "No space left on device" in log


def test_a_request_refused_before_its_body_is_recorded_without_it(
    tmp_path: Path, provider: str, serve_traced: Callable[..., tuple[str, Proc]]
) -> None:
    """Every request on a wire route leaves a line: one refused with 413 (over
    ``limits.max_body_bytes``) too, with its headers (no credential) and no body;
    ``prefixpin audit`` skips it, saying why, and audits the rest under the same
    numbering."""
    config = tmp_path / "c.yaml"
    config.write_text("limits:\n  max_body_bytes: 2000\n")
    trace = tmp_path / "trace.jsonl"
    base, _ = serve_traced(provider, trace, config)
    small = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    auth = {"authorization": "Bearer sk-replay-key", "x-agent": "probe"}
    with httpx.Client(base_url=base, trust_env=False, timeout=60, headers=auth) as client:
        assert client.post("/v1/chat/completions?api-key=sk-replay-key&v=1", json=big).status_code == 413
        assert client.post("/v1/chat/completions", json=small).status_code == 200
    wait_until(lambda: len(_lines(trace)) == 2, message="two lines recorded")
    raw = trace.read_bytes()
    assert not any(s.encode() in raw for s in SECRETS)
    first, second = (json.loads(line) for line in _lines(trace))
    assert (first["role"], first["status"], first["body"], first["path"]) == (
        "rejected",
        413,
        None,
        "/v1/chat/completions?v=1",
    )
    assert "body_base64" not in first and first["headers"]["x-agent"] == "probe"
    assert second["status"] == 200 and second["body"] == small

    out = subprocess.run(
        [*prefixpin_argv(), "audit", str(trace), "--json", "--no-progress"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trace.jsonl:1: skipped: prefixpin refused this request (413) before reading its body" in out.stderr
    report = json.loads(out.stdout)
    assert [r["index"] for r in report["requests"]] == [1]


def test_each_turn_is_one_line_whatever_its_line_breaks(
    tmp_path: Path, provider: str, serve_traced: Callable[..., tuple[str, Proc]]
) -> None:
    """A conversation whose turns the proxy parses by pieces of the one before: compact,
    then a new message after a line break, compact again, pretty-printed, compact.
    Each line holds its turn's bytes with every CR and LF a space (at its offset), no
    more: the turns known to hold none are written as they are."""
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    trace = tmp_path / "trace.jsonl"
    base, _ = serve_traced(provider, trace, config)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse.\nAnswer in one line."}]
    sent: list[bytes] = []
    headers = {"authorization": "Bearer sk-replay-key", "content-type": "application/json"}
    with httpx.Client(base_url=base, trust_env=False, timeout=60, headers=headers) as client:
        for turn in range(6):
            messages += [{"role": "user", "content": f"question {turn}\r\nplease"}]
            raw = json.dumps({"model": "m", "messages": messages}, separators=(",", ":")).encode()
            if turn == 1:  # the new message after a line break: a gap the proxy parses anew
                at = raw.rindex(b',{"role":"user"') + 1
                raw = raw[:at] + b"\r\n" + raw[at:]
            elif turn == 4:
                raw = json.dumps({"model": "m", "messages": messages}, indent=1).encode()
            reply = client.post("/v1/chat/completions", content=raw)
            assert reply.status_code == 200
            sent.append(raw)
            messages.append({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]})
    wait_until(lambda: len(_lines(trace)) == len(sent), message="every turn recorded")
    for line, raw in zip(_lines(trace), sent, strict=True):
        assert line[line.index(b',"body":') + 8 : -1] == raw.replace(b"\r", b" ").replace(b"\n", b" ")
