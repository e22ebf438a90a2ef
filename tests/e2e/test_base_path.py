"""An upstream URL whose path is wrong (``http://host:8080/v2``): the client gets the
upstream's own 404, the log one WARNING naming the upstream path, /readyz the reason.
A 404 about a model, or on a route the upstream lacks while it serves others, makes
nothing unready.  Real ``prefixpin serve`` processes, a real llama-server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import track
from tests.infra import rawupstream as raw
from tests.infra.procs import prefixpin_logs
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "hi"}]


def _warnings(log_dir: Path, text: str) -> int:
    return sum(line.count(text) for line in prefixpin_logs(log_dir).splitlines() if " WARNING " in line)


def test_a_wrong_base_path_is_warned_once_and_makes_readyz_say_so(
    serve: Callable[..., str], llama_server: str, log_dir: Path
) -> None:
    wrong = llama_server + "/v2"
    warning = f"the upstream answered 404 to POST {wrong}/v1/chat/completions: it has no such route"
    before = _warnings(log_dir, warning)
    proxy = serve(wrong)
    with httpx.Client(base_url=proxy, trust_env=False, timeout=30) as http:
        assert http.get("/readyz").status_code == 200  # nothing tells yet: llama's /v2/health 404 is no 5xx
        direct = httpx.post(wrong + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=30)
        for _ in range(3):  # on one connection: each answered and watched before the next is read
            r = http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
            assert (r.status_code, r.content) == (404, direct.content)  # the upstream's 404, verbatim
            assert r.headers["x-prefixpin-rewrites"] == ""
        ready = http.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["reasons"] == [
        "upstream: answers 404 to POST /v1/chat/completions: no such route under upstream.url's path "
        "(is that path right?)"
    ]
    assert _warnings(log_dir, warning) == before + 1  # one a minute, not one a request
    client = track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-local", max_retries=0))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="m", messages=MESSAGES)

    right = serve(llama_server + "/v1")  # a trailing /v1 is a right base: not doubled
    with httpx.Client(base_url=right, trust_env=False, timeout=60) as http:
        r = http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "max_tokens": 2})
        assert r.status_code == 200
        assert http.get("/readyz").status_code == 200
        assert "_created" not in http.get("/metrics").text  # one process: no start-time series either


def _answer_by_path(conn: raw.Conn) -> None:
    """/health and chat completions answer; /v1/responses is not there; a model
    named "gone" is not served (OpenAI's 404 shape)."""
    while (req := conn.read_request()) is not None:
        target = req.target
        if target == "/health" or (target == "/v1/chat/completions" and b'"gone"' not in req.body):
            conn.send(raw.json_response(b'{"status":"ok"}' if target == "/health" else raw.JSON_REPLY))
            continue
        if target == "/v1/chat/completions":
            body = b'{"error":{"message":"The model `gone` does not exist","code":"model_not_found"}}'
        else:
            body = b'{"error":{"message":"Not Found"}}'
        head = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        conn.send(head + body)


@pytest.fixture
def upstream() -> Iterator[raw.RawUpstream]:
    up = raw.RawUpstream(_answer_by_path)
    yield up
    up.close()


def test_a_model_404_or_a_missing_route_beside_served_ones_is_no_unready(
    serve: Callable[..., str], upstream: raw.RawUpstream, log_dir: Path
) -> None:
    model_warning = f"the upstream answered 404 to POST {upstream.url}/v1/chat/completions: its answer names a model"
    before = _warnings(log_dir, model_warning)
    proxy = serve(upstream.url)
    with httpx.Client(base_url=proxy, trust_env=False, timeout=30) as http:
        r = http.post("/v1/chat/completions", json={"model": "gone", "messages": MESSAGES})
        assert r.status_code == 404 and b"model_not_found" in r.content
        assert http.get("/readyz").status_code == 200  # the client's model, not the upstream's routes
        assert _warnings(log_dir, model_warning) == before + 1

        assert http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}).status_code == 200
        r = http.post("/v1/responses", json={"model": "m", "input": "hi"})
        assert r.status_code == 404
        assert http.get("/readyz").status_code == 200  # it serves chat: no reason to take it out
    wait_until(
        lambda: _warnings(log_dir, f"404 to POST {upstream.url}/v1/responses: it has no such route") >= 1,
        message="the missing route is warned about all the same",
    )


def test_readyz_asks_again(serve: Callable[..., str], log_dir: Path) -> None:
    """A replica that had no route is ready again once it has: /readyz asks it (a POST of {})."""
    fixed = False

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if req.target == "/health" or fixed:
                body = b'{"error":{"message":"bad request"}}' if req.body == b"{}" else raw.JSON_REPLY
                status = b"400 Bad Request" if req.body == b"{}" else b"200 OK"
            else:
                body, status = b"no", b"404 Not Found"
            conn.send(b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))

    up = raw.RawUpstream(script)
    try:
        proxy = serve(up.url)
        with httpx.Client(base_url=proxy, trust_env=False, timeout=30) as http:
            assert http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}).status_code == 404
            assert http.get("/readyz").status_code == 503
            fixed = True
            assert http.get("/readyz").status_code == 200
        probes = [r for r in up.requests if r.body == b"{}"]
        assert [r.target for r in probes] == ["/v1/chat/completions", "/v1/chat/completions"]
        assert all(r.header("authorization") is None for r in probes)
    finally:
        up.close()
