"""Security and faults (issue #16), against the real ``prefixpin serve`` process in
front of a raw-socket upstream (tests/infra/rawupstream.py) scripted per test."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.infra import rawupstream as raw
from tests.infra import tcp
from tests.infra.procs import free_port, prefixpin_logs
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
Serve = Callable[..., str]
WriteConfig = Callable[[dict[str, Any]], Path]


@pytest.fixture
def upstream() -> Iterator[Callable[[Callable[[raw.Conn], None]], raw.RawUpstream]]:
    made: list[raw.RawUpstream] = []

    def make(script: Callable[[raw.Conn], None]) -> raw.RawUpstream:
        made.append(raw.RawUpstream(script))
        return made[-1]

    yield make
    for u in made:
        u.close()


def _http(timeout: float = 30) -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=timeout)


def _metric(proxy: str, line: str) -> bool:
    with _http() as http:
        return line in http.get(proxy + "/metrics").text


def send_raw(base: str, request: bytes, timeout: float = 10) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side normalization); status and whole answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


# -- 1. a request reset after it was sent is never sent again ----------------------------------


@pytest.mark.parametrize("kind", ["chat", "chat-stream", "embeddings"])
def test_reset_after_request_is_502_and_never_resent(serve: Serve, upstream: Any, kind: str) -> None:
    up = upstream(raw.reset_after_read)
    proxy = serve(up.url)
    path, body = {
        "chat": ("/v1/chat/completions", BODY),
        "chat-stream": ("/v1/chat/completions", {**BODY, "stream": True}),
        "embeddings": ("/v1/embeddings", {"model": "m", "input": "x"}),
    }[kind]
    with _http() as http:
        r = http.post(proxy + path, json=body)
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["code"] == "upstream_unavailable" and "did not resend" in err["message"]
    assert _metric(proxy, 'prefixpin_upstream_errors_total{kind="reset"} 1.0')
    # A resend would go out, on a new connection, before the 502; a marker sent now
    # through the same path connects after it.  Once the upstream has read the marker
    # (its own 502 says so), it has counted every connection a resend could have used.
    marker = {
        **body,
        **({"input": "marker"} if "input" in body else {"messages": [{"role": "user", "content": "marker"}]}),
    }
    with _http() as http:
        assert http.post(proxy + path, json=marker).status_code == 502
    assert up.connections == 2 and len(up.requests) == 2, "a request the upstream read must not be sent twice"
    assert b"marker" in up.requests[1].body


def test_upstream_closing_after_each_stream_while_saying_keep_alive(serve: Serve, upstream: Any) -> None:
    up = upstream(raw.stream_then_close)  # what llama-server does
    proxy = serve(up.url)
    with _http() as http:
        for i in range(6):
            stream = i % 2 == 0
            if stream:
                with http.stream("POST", proxy + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
                    data = b"".join(r.iter_bytes())
                assert r.status_code == 200 and data.rstrip().endswith(b"[DONE]")
            else:
                r = http.post(proxy + "/v1/embeddings", json={"input": "x"})
                assert r.status_code == 200
            # The upstream thread closes right after answering, but may lag under load: the
            # next request goes once prefixpin's side of this connection has the FIN.
            wait_until(lambda: tcp.fin_received(up.port), timeout=5, message="the upstream's FIN arrived")
    assert len(up.requests) == 6


# -- 2. the path cannot escape the upstream's base path --------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "/v1/../../admin/x",
        "/v1/%2e%2e/%2E%2e/admin/x",
        "/v1/..%2f..%2fadmin/x",
        "/v1/models%2F..%2F..%2F..%2Fadmin",
        "/v1/.%2E/.%2e/admin",
        "/../admin/x",
        "/v1/..\\..\\admin",
        "/v1/%252e%252e/%252e%252e/admin",
    ],
)
def test_path_escaping_the_base_is_400(serve: Serve, upstream: Any, target: str) -> None:
    up = upstream(raw.answer_json)
    proxy = serve(up.url + "/tenantA/v1")
    status, answer = send_raw(proxy, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert status == 400
    err = orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert err["code"] == "invalid_path" and err["type"] == "invalid_request_error"
    assert up.requests == []


def test_path_reaches_the_upstream_as_received(serve: Serve, upstream: Any) -> None:
    up = upstream(raw.answer_json)
    proxy = serve(up.url + "/tenantA/v1")
    body = orjson.dumps(BODY)
    cases = [
        (b"GET /v1/a/../models HTTP/1.1", b"GET /tenantA/v1/a/../models HTTP/1.1"),
        (b"GET /v1/files/a%2Fb%2e?q=%2F&x=1 HTTP/1.1", b"GET /tenantA/v1/files/a%2Fb%2e?q=%2F&x=1 HTTP/1.1"),
        (b"GET http://evil.example:9/v1/models HTTP/1.1", b"GET /tenantA/v1/models HTTP/1.1"),  # absolute URI
        (b"POST /v1/chat/completions HTTP/1.1", b"POST /tenantA/v1/chat/completions HTTP/1.1"),
    ]
    for line, _ in cases:
        status, _ = send_raw(
            proxy,
            line + b"\r\nHost: evil.example:9\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
        )
        assert status == 200, line
    assert [r.line for r in up.requests] == [want for _, want in cases]
    assert {r.header("host") for r in up.requests} == {f"127.0.0.1:{up.port}"}


# -- 3. credentials in the upstream URL are never shown --------------------------------------------


def _no_secrets(text: str | bytes, *secrets: str) -> None:
    t = text.decode(errors="replace") if isinstance(text, bytes) else text
    for s in secrets:
        assert s not in t


def test_upstream_url_credentials_never_shown(
    serve: Serve, upstream: Any, write_config: WriteConfig, log_dir: Path
) -> None:
    password, key = "pw-SECRET-4711", "qs-SECRET-0815"
    cfg = write_config({"upstream": {"timeout_s": 0.5}, "log": {"level": "debug", "access": True}})
    # The access lines of each proxy's last request (ok's chat, then /readyz on the other three).
    last = {'"POST /v1/chat/completions HTTP/1.1" 200': 1, '"GET /readyz HTTP/1.1" 503': 3}
    logged = {line: prefixpin_logs(log_dir).count(line) for line in last}

    def url(port: int) -> str:
        return f"http://alice:{password}@127.0.0.1:{port}/v1?api_key={key}"

    works = upstream(raw.answer_json)
    with _http() as http:
        ok = serve(url(works.port), cfg)
        assert http.post(ok + "/v1/chat/completions", json=BODY).status_code == 200
        sent = works.requests[0]
        assert sent.target == f"/v1/chat/completions?api_key={key}"  # the base's query goes along
        assert sent.header("authorization") == "Basic YWxpY2U6cHctU0VDUkVULTQ3MTE="  # and its userinfo
        bodies = []
        for script in (raw.reset_after_read, raw.hang_after_accept):  # 502, 504
            proxy = serve(url(upstream(script).port), cfg)
            r = http.post(proxy + "/v1/chat/completions", json=BODY)
            assert r.status_code in (502, 504)
            bodies.append(r.content)
            e = http.post(proxy + "/v1/embeddings", json={"input": "x"})
            assert e.status_code == r.status_code
            bodies.append(e.content)
            ready = http.get(proxy + "/readyz")
            assert ready.status_code == 503
            bodies.append(ready.content)
        down = serve(url(free_port()), cfg)
        bodies += [http.post(down + "/v1/chat/completions", json=BODY).content, http.get(down + "/readyz").content]
    for b in bodies:
        _no_secrets(b, password, key, "alice", "127.0.0.1")  # no URL at all in what a client sees
    wait_until(
        lambda: all(prefixpin_logs(log_dir).count(line) >= logged[line] + n for line, n in last.items()),
        message="each proxy's last access line",
    )
    logs = "".join(p.read_text(errors="replace") for p in log_dir.glob("prefixpin-*.log"))
    assert "upstream" in logs
    _no_secrets(logs, password, key)


def test_access_log_hides_query_secrets(serve: Serve, upstream: Any, write_config: WriteConfig, log_dir: Path) -> None:
    line = "/v1/models?api_key=***&limit=5&access_token=***&API-KEY=***"
    logged = prefixpin_logs(log_dir).count(line)
    up = upstream(raw.answer_json)
    proxy = serve(up.url, write_config({"log": {"access": True}}))
    with _http() as http:
        r = http.get(proxy + "/v1/models?api_key=ak-SECRET-1&limit=5&access_token=at-SECRET-2&API-KEY=ak-SECRET-3")
    assert r.status_code == 200
    assert up.requests[0].target.endswith("api_key=ak-SECRET-1&limit=5&access_token=at-SECRET-2&API-KEY=ak-SECRET-3")
    wait_until(lambda: prefixpin_logs(log_dir).count(line) > logged, message="the request's access line")
    logs = "".join(p.read_text(errors="replace") for p in log_dir.glob("prefixpin-*.log"))
    assert "/v1/models?api_key=***&limit=5&access_token=***&API-KEY=***" in logs
    _no_secrets(logs, "ak-SECRET-1", "at-SECRET-2", "ak-SECRET-3")


# -- 4. slow clients: header and body deadlines, admission after the body -----------------------


@pytest.mark.parametrize("max_concurrency", [50, 0])  # 0: the hot route (proxy.server.HotCycle) takes the chat POSTs
def test_slow_clients_do_not_take_the_slots(
    serve: Serve, upstream: Any, write_config: WriteConfig, max_concurrency: int
) -> None:
    up = upstream(raw.answer_json)
    limits = {"max_concurrency": max_concurrency, "header_timeout_s": 2, "body_timeout_s": 2}
    proxy = serve(up.url, write_config({"limits": limits}))
    port = int(proxy.rsplit(":", 1)[1])
    slow: list[socket.socket] = []
    try:
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            path = b"/v1/chat/completions" if i % 2 else b"/v1/embeddings"
            if i < 20:  # headers never finish
                s.sendall(
                    b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 30
                )
            elif i < 55:  # the body never finishes
                s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 40)
            # else: connects and says nothing
            slow.append(s)
        # Until prefixpin has accepted all 60 and read what each sent (nothing left in
        # its queues), so they hold whatever they can before the real requests come.
        wait_until(lambda: tcp.server_caught_up(port), timeout=10, message="the slow clients accepted and read")
        with _http() as http:
            assert http.post(proxy + "/v1/chat/completions", json=BODY).status_code == 200
            assert http.post(proxy + "/v1/embeddings", json={"input": "x"}).status_code == 200
        outcomes = []
        for s in slow:  # each is answered 408 or closed after its deadline (generous bound: 30 s)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            outcomes.append(data.split(b"\r\n", 1)[0])
    finally:
        for s in slow:
            s.close()
    assert set(outcomes[20:55]) == {b"HTTP/1.1 408 Request Timeout"}
    assert set(outcomes[:20]) == {b"HTTP/1.1 408 Request Timeout"}
    assert set(outcomes[55:]) == {b""}  # nothing sent: closed
    assert len(up.requests) == 2


# -- 5. smaller ones ---------------------------------------------------------------------------------


def test_cut_passthrough_stream_is_cut_for_the_client(serve: Serve, upstream: Any) -> None:
    up = upstream(raw.cut_chunked)
    proxy = serve(up.url)
    with _http() as http, http.stream("POST", proxy + "/v1/completions", json={"prompt": "x"}) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            b"".join(r.iter_raw())
    assert _metric(proxy, 'prefixpin_upstream_errors_total{kind="stream_cut"} 1.0')
    with _http() as http:
        assert http.get(proxy + "/healthz").status_code == 200


@pytest.mark.parametrize("script", [raw.hang_after_accept, raw.headers_then_hang], ids=["accept", "headers"])
def test_hang_after_connect_is_a_response_timeout(
    serve: Serve, upstream: Any, write_config: WriteConfig, script: Any
) -> None:
    proxy = serve(upstream(script).url, write_config({"upstream": {"timeout_s": 0.5}}))
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", json=BODY)
    assert r.status_code == 504
    message = r.json()["error"]["message"]
    assert "waiting for the upstream's response" in message and "connecting" not in message


def test_a_stream_that_stalls_is_cut_and_logged_with_where(
    serve: Serve, upstream: Any, write_config: WriteConfig, log_dir: Path
) -> None:
    """A stream with nothing for upstream.timeout_s ends with an error event; the log
    line says where and how long, and no line ends in an empty "()"."""

    def script(conn: raw.Conn) -> None:
        if conn.read_request() is not None:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            conn.send(head + raw.chunk(b"data: " + raw.STREAM_EVENTS[0] + b"\n\n"))
            conn.hang()

    up = upstream(script)
    proxy = serve(up.url, write_config({"upstream": {"timeout_s": 0.5}}))
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", json={**BODY, "stream": True})
    assert r.status_code == 200 and b"upstream_stream_cut" in r.content
    line = (
        "the upstream cut a stream on chat_completions: prefixpin timed out waiting for the upstream's "
        f"response ({up.url}: nothing in 0.5 s)"
    )
    wait_until(lambda: line in prefixpin_logs(log_dir), message="the stream-timeout line")
    assert not [ln for ln in prefixpin_logs(log_dir).splitlines() if ln.rstrip().endswith("()")]


def test_hop_by_hop_and_own_headers_are_not_forwarded(serve: Serve, upstream: Any) -> None:
    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(
                raw.json_response(
                    extra=b"Connection: X-Resp-Hop\r\nX-Resp-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Resp-Keep: 1\r\n"
                )
            )

    up = upstream(script)
    proxy = serve(up.url)
    body = b'{"input": "x"}'
    length = str(len(body)).encode()
    headers = (
        b"Host: x\r\nConnection: keep-alive, X-Hop-Secret\r\nConnection: close\r\nX-Hop-Secret: 1\r\n"
        b"Keep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\n"
        b"Proxy-Connection: keep-alive\r\nTrailer: x\r\nX-Prefixpin-Tenant: t\r\nX-Prefixpin-Parent: p\r\n"
        b"X-Keep: yes\r\nContent-Length: " + length + b"\r\n\r\n"
    )
    for path in (b"/v1/embeddings", b"/v1/chat/completions"):
        status, answer = send_raw(proxy, b"POST " + path + b" HTTP/1.1\r\n" + headers + body)
        assert status == 200
        head = answer.partition(b"\r\n\r\n")[0].lower()
        assert b"x-resp-keep: 1" in head and b"x-resp-hop" not in head and b"keep-alive: timeout" not in head
    for req in up.requests:
        names = {k.lower() for k, _ in req.headers}
        assert "x-keep" in names
        assert not names & {
            "x-hop-secret",
            "keep-alive",
            "te",
            "proxy-authorization",
            "proxy-connection",
            "trailer",
            "x-prefixpin-tenant",
            "x-prefixpin-parent",
        }
