"""The security probe's cases, as regressions: a real ``prefixpin serve`` between raw
sockets on both sides (the framing bugs live where no HTTP client library goes).

Trailers, pipelining, Upgrade, header floods, the connection cap, a misbehaving
upstream (bytes after a complete response, a status HTTP does not have, a body
compressed although identity was asked for), credentials that differ only in
bytes that are not UTF-8 — and the groups that held, kept: smuggling framings
and a victim's lineage out of another tenant's reach."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import brotli
import httpx
import orjson
import pytest

from tests.infra import rawupstream as raw
from tests.infra.front import buffered_responses, closed, read_response
from tests.infra.procs import Proc, free_port, prefixpin_argv
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

SYSTEM = "You are a coding agent. Session ID: 20260513_204511_d02a5d. " + "Follow the rules. " * 40
USAGE = b'"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}'


@pytest.fixture
def upstream() -> Iterator[Callable[..., raw.RawUpstream]]:
    made: list[raw.RawUpstream] = []

    def make(script: Callable[[raw.Conn], None]) -> raw.RawUpstream:
        made.append(raw.RawUpstream(script))
        return made[-1]

    yield make
    for u in made:
        u.close()


def _chat(user: str = "hi", *, stream: bool = False) -> bytes:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _post(body: bytes, *, path: bytes = b"/v1/chat/completions", extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        path,
        len(body),
    )
    return head + extra + b"\r\n" + body


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _metrics(base: str) -> str:
    return httpx.get(base + "/metrics", timeout=10).text


def _answer(body: bytes = raw.JSON_REPLY) -> Callable[[raw.Conn], None]:
    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(raw.json_response(body))

    return script


# -- 1. trailer fields are never headers -----------------------------------------------------------


def test_trailer_fields_reach_no_header_no_tenant_and_no_bypass(serve: Any, upstream: Any) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    body = _chat()
    chunked = b"%x\r\n%s\r\n0\r\n" % (len(body), body)
    trailers = (
        b"authorization: Bearer victim\r\nx-prefixpin-bypass: 1\r\nx-injected: 1\r\nx-prefixpin-tenant: v\r\n\r\n"
    )
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    with _connect(base) as sock:
        sock.sendall(head + b"transfer-encoding: chunked\r\ntrailer: authorization\r\n\r\n" + chunked + trailers)
        response, _ = read_response(sock, bytearray())
    assert response.startswith(b"HTTP/1.1 200")
    assert b"x-prefixpin-role: bypass" not in response  # the bypass was a trailer: not honoured
    (req,) = up.requests
    names = {k.lower() for k, _ in req.headers}
    assert not names & {"authorization", "x-injected", "x-prefixpin-bypass", "x-prefixpin-tenant"}
    assert req.body == body


def test_a_key_sent_only_as_a_trailer_continues_no_lineage(serve: Any, upstream: Any) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    victim = {"authorization": "Bearer sk-victim"}
    first = httpx.post(base + "/v1/chat/completions", content=_chat(), headers=victim, timeout=10)
    assert first.headers["x-prefixpin-role"] == "root"
    reply = {"role": "assistant", "content": "ok"}
    turn2 = orjson.loads(_chat())
    turn2["messages"] += [reply, {"role": "user", "content": "more"}]
    body = orjson.dumps(turn2)
    with _connect(base) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\nauthorization: Bearer sk-victim\r\n\r\n" % (len(body), body)
        )
        head, _ = read_response(sock, bytearray())
    assert b"x-prefixpin-role: continuation" not in head and b"x-prefixpin-role: fork" not in head


# -- 2. pipelined responses are each delivered, in order --------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_pipelined_requests_through_prefixpin_to_a_slow_reader(serve: Any, upstream: Any, stream: bool) -> None:
    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            n = orjson.loads(req.body)["messages"][-1]["content"].encode()
            if b'"stream":true' in req.body:
                event = (
                    b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}' % n
                )
                conn.send(raw.sse_response([event, b"[DONE]"]))
            else:
                conn.send(raw.json_response(raw.JSON_REPLY.replace(b'"ok"', b'"%s"' % n)))

    base = serve(upstream(script).url)
    with _connect(base) as sock:
        sock.sendall(
            b"".join(_post(_chat(f"n{i}", stream=stream), extra=b"authorization: Bearer k\r\n") for i in range(3))
        )
        # A slow reader: nothing read until every answer is written (peeked at in the buffer).
        wait_until(lambda: buffered_responses(sock) == 3, timeout=10, message="three answers written, none read")
        buf = bytearray()
        bodies = [read_response(sock, buf)[1] for _ in range(3)]
    for i, body in enumerate(bodies):
        assert b'"n%d"' % i in body, (i, body)


# -- 4. header floods and the connection cap --------------------------------------------------------


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _serve_proc(log_dir: Path, upstream: str, *, nofile: int | None = None) -> tuple[Proc, str]:
    port = free_port()
    argv = [*prefixpin_argv(), "serve", "--upstream", upstream, "--port", str(port)]
    if nofile is not None:
        argv = ["prlimit", f"--nofile={nofile}:{nofile}", *argv]
    proc = Proc(f"prefixpin-{port}", argv, log_dir, env={"PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    proc.wait_http(base + "/healthz", timeout=30)
    return proc, base


def test_a_header_flood_is_431_and_costs_no_memory(log_dir: Path, upstream: Any) -> None:
    up = upstream(_answer())
    proc, base = _serve_proc(log_dir, up.url)
    try:
        httpx.get(base + "/healthz", timeout=5)
        pid = int(httpx.get(base + "/healthz", timeout=5).json()["pid"])
        before = _rss_kb(pid)
        sent = 0
        with _connect(base) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            try:
                while sent < 96 << 20:
                    sock.sendall(b"x-flood-%d: %s\r\n" % (sent, b"a" * 8000))
                    sent += 8000
            except OSError:
                pass
            head, _ = read_response(sock, bytearray()) if sent < 96 << 20 else (b"", b"")
        # What the kernel buffers on both sides (a few MiB on loopback) is all the client
        # gets to send: the server stops reading at the limit, answers and closes.
        assert sent < 24 << 20, "the head was read far past the limit"
        assert head.startswith(b"HTTP/1.1 431"), head
        assert _rss_kb(pid) - before < 20_000  # KiB
        assert up.requests == []
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
    finally:
        proc.stop()


def test_idle_connections_past_the_fd_limit_leave_healthz_answering(log_dir: Path, upstream: Any) -> None:
    """With a 256-file limit, 300 connections that each sent one byte: the oldest are
    closed to make room, /healthz is answered and the process keeps serving."""
    up = upstream(_answer())
    proc, base = _serve_proc(log_dir, up.url, nofile=256)
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            s = _connect(base)
            s.sendall(b"P")
            idle.append(s)
        for _ in range(3):
            r = httpx.get(base + "/healthz", timeout=5)
            assert r.status_code == 200
        r = httpx.post(
            base + "/v1/chat/completions", content=_chat(), headers={"authorization": "Bearer k"}, timeout=10
        )
        assert r.status_code == 200
        assert sum(closed(s, 0.2) for s in idle[:100]) > 50  # the oldest went first
        assert proc.alive()
    finally:
        for s in idle:
            s.close()
        proc.stop()


# -- 5. the upstream client stops at a complete response --------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{"second":1}\n',
        b'HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{"partial',
    ],
    ids=["second-response", "partial-response"],
)
def test_bytes_after_a_complete_response_reach_no_client(serve: Any, upstream: Any, extra: bytes) -> None:
    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(raw.json_response() + extra)

    up = upstream(script)
    base = serve(up.url)
    with httpx.Client(trust_env=False, timeout=10) as http:
        a = http.post(base + "/v1/chat/completions", content=_chat("a"), headers={"authorization": "Bearer tenant-a"})
        # Nothing to wait for: the stray bytes came in the same write as a's answer, so
        # prefixpin had them before a's answer reached this client.
        b = http.post(base + "/v1/chat/completions", content=_chat("b"), headers={"authorization": "Bearer tenant-b"})
    assert a.content == raw.JSON_REPLY and b.content == raw.JSON_REPLY
    assert len(up.requests) == 2  # the second tenant's request was sent on a clean connection and answered


# -- 6. a status HTTP does not have -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"], ids=["chat", "passthrough"])
def test_a_status_over_599_is_a_502(serve: Any, upstream: Any, path: str) -> None:
    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(b"HTTP/1.1 600 Odd\r\ncontent-length: 2\r\n\r\n{}")

    base = serve(upstream(script).url)
    r = httpx.post(base + path, content=_chat(), timeout=10)
    assert r.status_code == 502 and "status 600" in r.json()["error"]["message"]
    assert 'prefixpin_upstream_errors_total{kind="protocol"} 1.0' in _metrics(base)


# -- 7. credentials hashed as bytes ------------------------------------------------------------------


def test_keys_that_differ_only_in_invalid_utf8_are_two_tenants(serve: Any, upstream: Any) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    first = httpx.post(base + "/v1/chat/completions?key=sk-%FF%FE", content=_chat(), timeout=10)
    turn2 = orjson.loads(_chat())
    turn2["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    same = httpx.post(base + "/v1/chat/completions?key=sk-%FF%FE", content=orjson.dumps(turn2), timeout=10)
    other = httpx.post(base + "/v1/chat/completions?key=sk-%FE%FF", content=orjson.dumps(turn2), timeout=10)
    assert first.headers["x-prefixpin-role"] == "root"
    assert same.headers["x-prefixpin-role"] == "continuation"
    assert other.headers["x-prefixpin-role"] == "root"  # not the first key's lineage


# -- 8. Connection: Upgrade ----------------------------------------------------------------------------


def test_a_post_asking_to_upgrade_is_forwarded_whole_and_the_next_request_answered(serve: Any, upstream: Any) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    body = _chat()
    with _connect(base) as sock:
        sock.sendall(
            _post(
                body,
                extra=b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n",
            )
            + _post(_chat("second"))
        )
        buf = bytearray()
        first, second = read_response(sock, buf), read_response(sock, buf)
    assert first[0].startswith(b"HTTP/1.1 200") and second[0].startswith(b"HTTP/1.1 200")
    assert [r.body for r in up.requests] == [body, _chat("second")]
    assert not {k.lower() for k, _ in up.requests[0].headers} & {"upgrade", "http2-settings"}


# -- 9. compressed answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["br", "gzip"])
def test_a_compressed_chat_answer_is_decoded_and_read(serve: Any, upstream: Any, coding: str) -> None:
    plain = raw.JSON_REPLY[:-1] + b"," + USAGE + b"}"
    packed = brotli.compress(plain) if coding == "br" else gzip.compress(plain)

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(raw.json_response(packed, extra=b"content-encoding: %s\r\n" % coding.encode()))

    up = upstream(script)
    base = serve(up.url)
    r = httpx.post(base + "/v1/chat/completions", content=_chat(), headers={"authorization": "Bearer k"}, timeout=10)
    assert r.status_code == 200 and r.content == plain and "content-encoding" not in r.headers
    assert up.requests[0].header("accept-encoding") == "identity"
    assert 'prefixpin_prompt_tokens_total{model="m",role="root"} 7.0' in _metrics(base)


def test_a_coding_prefixpin_cannot_undo_passes_with_its_header(serve: Any, upstream: Any) -> None:
    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(raw.json_response(b"\x28\xb5\x2f\xfdzstd-bytes", extra=b"content-encoding: zstd\r\n"))

    base = serve(upstream(script).url)
    r = httpx.post(base + "/v1/chat/completions", content=_chat(), timeout=10)
    assert r.status_code == 200 and r.headers["content-encoding"] == "zstd"
    assert r.read() is not None


def test_passthrough_keeps_the_upstreams_coding(serve: Any, upstream: Any) -> None:
    packed = brotli.compress(b'{"data":[]}')

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(raw.json_response(packed, extra=b"content-encoding: br\r\n"))

    base = serve(upstream(script).url)
    with _connect(base) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\naccept-encoding: br\r\n\r\n")
        head, body = read_response(sock, bytearray())
    assert b"content-encoding: br" in head and body == packed


# -- the groups that held: smuggling framings ---------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        b"content-length: 2\r\ntransfer-encoding: chunked\r\n",
        b"content-length: 2\r\ncontent-length: 3\r\n",
        b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
        b"transfer-encoding: gzip, chunked\r\n",
        b"transfer-encoding: chunked, identity\r\n",
        b"transfer-encoding: xchunked\r\n",
        b"content-length: 2\r\n folded: x\r\n",
        b"content-length: +2\r\n",
        b"content-length: 2, 2\r\n",
    ],
)
def test_smuggling_framings_are_400_and_nothing_reaches_the_upstream(serve: Any, upstream: Any, framing: bytes) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + framing + b"\r\n{}0\r\n\r\n"
    with _connect(base) as sock:
        sock.sendall(request + _post(_chat()))
        head, _ = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 400"), head
    # Anything prefixpin took from the refused connection, it took before the 400
    # (answers go in order, nothing is read after a refusal); a marker through the same
    # path comes after that, so once the upstream has answered the marker it would have
    # the rest too: the marker must be all it got.
    with _connect(base) as sock:
        sock.sendall(_post(_chat("marker")))
        assert read_response(sock, bytearray())[0].startswith(b"HTTP/1.1 200")
    assert [r.body for r in up.requests] == [_chat("marker")]


def test_bare_lf_request_is_400(serve: Any, upstream: Any) -> None:
    up = upstream(_answer())
    base = serve(up.url)
    with _connect(base) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\nhost: x\ncontent-length: 2\n\n{}")
        head, _ = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 400")
    assert up.requests == []


# -- the groups that held, and the fork guard's variants ---------------------------------------------

USER1 = {"role": "user", "content": "List the files in the repo, please."}
PARENT_REPLY = {"role": "assistant", "content": "Sure."}


def _chunk(delta: dict[str, Any], finish: str | None = None, *, end: bytes = b"\n\n") -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps(obj) + end


def _piece(name: str | None = None, args: str = "") -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": args}
    if name is not None:
        fn["name"] = name
    call: dict[str, Any] = {"index": 0, "function": fn}
    if name is not None:
        call.update(id="call_1", type="function")
    return {"tool_calls": [call]}


FORK_STREAMS = {
    # a name in pieces whose first piece is an offered tool's name
    "name-in-pieces": [_chunk(_piece("memory")), _chunk(_piece("_purge_all", '{"all":')), _chunk(_piece(None, "1}"))],
    # events ended by \n\r\n (valid SSE), the call in the second
    "crlf-event-end": [_chunk({"content": "ok"}, end=b"\n\r\n") + _chunk(_piece("terminal", "{}"), end=b"\n\r\n")],
    # the legacy function_call
    "legacy-function-call": [_chunk({"function_call": {"name": "terminal", "arguments": "{}"}})],
}


@pytest.mark.parametrize("variant", list(FORK_STREAMS))
def test_a_forks_stream_never_carries_a_call_to_a_tool_it_did_not_offer(
    serve: Any, upstream: Any, variant: str
) -> None:
    from tests import hermes

    events = FORK_STREAMS[variant]

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b'"stream":true' not in req.body:
                reply = {"id": "p", "choices": [{"index": 0, "message": PARENT_REPLY, "finish_reason": "stop"}]}
                conn.send(raw.json_response(orjson.dumps(reply)))
                continue
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            tail = _chunk({}, "tool_calls") + b"data: [DONE]\n\n"
            conn.send(head + b"".join(raw.chunk(e) for e in [*events, tail]) + b"0\r\n\r\n")

    base = serve(upstream(script).url)
    key = {"authorization": "Bearer sk-guard"}
    parent = hermes.request(hermes.system_prompt(), [USER1], hermes.tools_full())
    assert httpx.post(base + "/v1/chat/completions", json=parent, headers=key, timeout=10).status_code == 200
    system = hermes.system_prompt(minute="02:31 PM", session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW)
    history = [USER1, PARENT_REPLY, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    fork = hermes.request(system, history, hermes.tools_review(), stream=True)
    r = httpx.post(base + "/v1/chat/completions", json=fork, headers=key, timeout=10)
    assert r.headers["x-prefixpin-role"] == "fork", r.headers
    assert b"terminal" not in r.content and b"_purge_all" not in r.content
    assert b"data: [DONE]" in r.content
    assert "prefixpin_blocked_tool_calls_total 1.0" in _metrics(base)
