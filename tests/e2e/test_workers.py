"""Several workers on one port (``listen.workers``), end to end: real ``prefixpin
serve`` processes sharing a real redis-server, in front of a real llama-server, the
openai SDK as client.

Which worker serves a connection is the kernel's choice (SO_REUSEPORT), so each
test opens connections until it holds one to each worker; ``/healthz`` names the
process that answered."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import hermes
from tests.conftest import track
from tests.infra.procs import free_port, prefixpin_argv
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

USER1 = {"role": "user", "content": "List the files in the repo, please."}


def _conn(base: str) -> tuple[httpx.Client, int]:
    """A client holding one keep-alive connection, and the worker pid behind it."""
    http = track(httpx.Client(base_url=base, trust_env=False, timeout=120, limits=httpx.Limits(max_connections=1)))
    return http, int(http.get("/healthz").json()["pid"])


def _one_per_worker(base: str, n: int = 2) -> dict[int, httpx.Client]:
    held: dict[int, httpx.Client] = {}
    for _ in range(200):
        http, pid = _conn(base)
        held.setdefault(pid, http)
        if len(held) == n:
            return held
    raise AssertionError(f"200 connections reached only {len(held)} of {n} workers")


def _sdk(base: str, http: httpx.Client) -> openai.OpenAI:
    return track(openai.OpenAI(base_url=base + "/v1", api_key="sk-tenant-1", max_retries=0, http_client=http))


def _turn(client: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, tools=hermes.tools_full(), max_tokens=4
    )


def _reply(raw: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": raw.parse().choices[0].message.content}


def _sys(minute: str) -> dict[str, Any]:
    return {"role": "system", "content": hermes.system_prompt(minute=minute)}


def _requests_total(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == "prefixpin_requests"
        for s in f.samples
        if s.name == "prefixpin_requests_total" and s.labels["route"] == "chat_completions"
    )


@pytest.fixture
def workers_config(write_config: Callable[[dict[str, Any]], Path], redis_proc: Callable[..., Any]) -> Path:
    """Two workers on a Redis of this test's own (another test's lineages are not in it)."""
    _, url = redis_proc()
    return write_config({"listen": {"workers": 2}, "store": {"backend": "redis", "redis_url": url}})


def test_a_lineage_continues_on_whichever_worker_serves_it(
    serve: Callable[..., str], workers_config: Path, llama_server: str
) -> None:
    base = serve(llama_server, workers_config)
    (pid_a, a), (pid_b, b) = _one_per_worker(base).items()
    assert pid_a != pid_b
    on_a, on_b = _sdk(base, a), _sdk(base, b)

    t1 = _turn(on_a, [_sys("02:30 PM"), USER1])
    assert t1.headers["x-prefixpin-role"] == "root"
    history = [USER1, _reply(t1), {"role": "user", "content": "And now the tests?"}]
    t2 = _turn(on_b, [_sys("02:31 PM"), *history])  # the other worker, a minute later
    assert t2.headers["x-prefixpin-role"] == "continuation"
    assert t2.headers["x-prefixpin-lineage"] == t1.headers["x-prefixpin-lineage"]
    assert "hermes.conversation_started" in t2.headers["x-prefixpin-rewrites"]  # the minute pinned
    history += [_reply(t2), {"role": "user", "content": "Thanks. Commit it."}]
    t3 = _turn(on_a, [_sys("02:33 PM"), *history])  # and back
    assert t3.headers["x-prefixpin-role"] == "continuation"
    assert t3.headers["x-prefixpin-lineage"] == t1.headers["x-prefixpin-lineage"]
    usage = t3.parse().usage
    assert usage.prompt_tokens_details.cached_tokens > 0  # the pinned prefix hit llama-server's cache

    # /metrics is every worker's: both connections see all three requests.
    # (each worker counts a response a moment after it: DRAIN_S)
    wait_until(lambda: _requests_total(a) == _requests_total(b) == 3, message="every worker's /metrics sums all three")
    assert "_created" not in a.get("/metrics").text  # no start-time series: they doubled the exposition


def _pids(base: str) -> set[int]:
    return {_conn(base)[1] for _ in range(40)}


def _serve_process(base: str) -> int:
    """The serve process: the workers' parent."""
    worker = _conn(base)[1]
    with open(f"/proc/{worker}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _kill_and_await_replacements(base: str, workers: set[int]) -> None:
    """SIGKILL every worker, then wait until two new ones serve."""
    for pid in workers:
        os.kill(pid, signal.SIGKILL)

    def replaced() -> bool:
        try:
            fresh = _pids(base)
        except httpx.HTTPError:
            return False
        return len(fresh) == 2 and not fresh & workers

    wait_until(replaced, timeout=60, interval=0.2, message="two new workers serve in place of the killed ones")


def test_a_killed_worker_is_replaced_and_the_lineages_are_still_there(
    serve: Callable[..., str], workers_config: Path, llama_server: str
) -> None:
    base = serve(llama_server, workers_config)
    workers = _one_per_worker(base)
    first = _sdk(base, next(iter(workers.values())))
    t1 = _turn(first, [_sys("02:30 PM"), USER1])
    _kill_and_await_replacements(base, set(workers))
    history = [USER1, _reply(t1), {"role": "user", "content": "And now the tests?"}]
    t2 = _turn(_sdk(base, _conn(base)[0]), [_sys("02:31 PM"), *history])
    assert t2.headers["x-prefixpin-role"] == "continuation"  # the lineages are in Redis
    assert t2.headers["x-prefixpin-lineage"] == t1.headers["x-prefixpin-lineage"]


def _start(port: int, upstream: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [*prefixpin_argv(), "serve", "--upstream", upstream, "--port", str(port), "--config", str(config)]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    def serves() -> bool:
        assert proc.poll() is None, f"prefixpin exited with {proc.returncode}"
        try:
            return httpx.get(base + "/healthz", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(serves, timeout=30, interval=0.1, message="prefixpin serves /healthz")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_port_is_not_shared_with_a_second_prefixpin_and_sigterm_stops_every_worker(
    tmp_path: Path, workers_config: Path, llama_server: str
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = workers_config
    first = _start(port, llama_server, config, tmp_path / "first.log")
    try:
        _wait_ready(base, first)
        workers = _pids(base)
        second = _start(port, llama_server, config, tmp_path / "second.log")
        assert second.wait(30) == 3
        assert "address already in use" in (tmp_path / "second.log").read_text().lower()
        assert _pids(base) == workers  # still served by the first one's workers only
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        wait_until(lambda: all(_gone(pid) for pid in workers), timeout=10, message="every worker stopped")
    finally:
        first.kill()
        first.wait()


def test_workers_stop_when_their_serve_process_is_killed(
    tmp_path: Path, workers_config: Path, llama_server: str
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(port, llama_server, workers_config, tmp_path / "serve.log")
    try:
        _wait_ready(base, proc)
        workers = _pids(base)
        assert _serve_process(base) == proc.pid
        proc.kill()
        proc.wait()
        wait_until(lambda: all(_gone(pid) for pid in workers), timeout=30, message="orphaned workers kept serving")
    finally:
        proc.kill()
        proc.wait()


def test_a_streamed_turn_is_recorded_before_its_worker_can_be_killed(
    serve: Callable[..., str], workers_config: Path, llama_server: str
) -> None:
    """A worker writes its record to Redis before the client's last bytes: killed the
    moment the stream ends, it has lost nothing; the next turn, on the worker that
    replaces it, continues the lineage."""
    base = serve(llama_server, workers_config)
    workers = _one_per_worker(base)
    first = _sdk(base, next(iter(workers.values())))
    with first.chat.completions.with_streaming_response.create(
        model="tiny", messages=[_sys("02:30 PM"), USER1], tools=hermes.tools_full(), max_tokens=4, stream=True
    ) as t1:
        lineage = t1.headers["x-prefixpin-lineage"]
        text = "".join(c.choices[0].delta.content or "" for c in t1.parse() if c.choices)
    _kill_and_await_replacements(base, set(workers))
    history = [USER1, {"role": "assistant", "content": text}, {"role": "user", "content": "And now the tests?"}]
    t2 = _turn(_sdk(base, _conn(base)[0]), [_sys("02:31 PM"), *history])
    assert t2.headers["x-prefixpin-role"] == "continuation"
    assert t2.headers["x-prefixpin-lineage"] == lineage
