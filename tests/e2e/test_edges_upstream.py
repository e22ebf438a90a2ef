"""Bounded edges, the upstream's side (SPEC section 2i): whatever an upstream sends, a
real ``prefixpin serve`` holds a bounded amount of memory for it, keeps its event loop
turning, and tells the client the truth — a compressed body decoded with an output
bound, an SSE event bound, relay as sent past either, corrupt or cut encodings as a
502 (an error event on a stream), a response head bound, a TLS mismatch named."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.infra import hostile
from tests.infra import rawupstream as raw
from tests.infra.hostile import MiB
from tests.infra.memory import Watch
from tests.infra.procs import Proc, free_port, prefixpin_argv, start_prefixpin
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAM = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
Script = Callable[[raw.Conn], None]


@pytest.fixture
def upstream() -> Iterator[Callable[[Script], raw.RawUpstream]]:
    made: list[raw.RawUpstream] = []

    def make(script: Script) -> raw.RawUpstream:
        made.append(raw.RawUpstream(script))
        return made[-1]

    yield make
    for u in made:
        u.close()


@pytest.fixture
def pin(log_dir: Path, write_config: Callable[[dict[str, Any]], Path]) -> Iterator[Callable[..., tuple[Proc, str]]]:
    """``prefixpin serve`` in front of ``url`` with ``config``; its process for memory."""
    procs: list[Proc] = []

    def start(url: str, config: dict[str, Any] | None = None) -> tuple[Proc, str]:
        path = write_config(config) if config else None
        proc, base = start_prefixpin(log_dir, upstream=url, config=path, name=f"prefixpin-{free_port()}")
        procs.append(proc)
        return proc, base

    yield start
    for proc in procs:
        proc.stop()


def answering(response: bytes | Callable[[raw.RawRequest], bytes]) -> Script:
    """An upstream that answers every request with ``response`` (or what it makes of the request)."""

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            conn.send(response(req) if callable(response) else response)

    return script


def streaming(response: bytes) -> Script:
    """An upstream that answers a stream request with ``response``, others with JSON."""
    return answering(lambda req: response if b'"stream":true' in req.body else raw.json_response())


def exchange(base: str, request: bytes) -> tuple[bytes, bytes]:
    """One request (``connection: close``) on a fresh connection, raw; the head and body
    (a chunked body dechunked), read to the close."""
    host, port = base.removeprefix("http://").split(":")
    parts = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        while data := sock.recv(1 << 20):
            parts.append(data)
    head, _, body = b"".join(parts).partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = hostile.dechunk(body)
    return head, body


def post(path: bytes, body: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n" % path
    return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)


def metric(base: str, line: str) -> bool:
    return line in httpx.get(base + "/metrics", timeout=10).text


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return None


def warm(base: str) -> None:
    """One ordinary request first: what the process imports and allocates on its first
    request is not counted against the bound."""
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    httpx.post(base + "/v1/chat/completions", content=CHAT, timeout=10)


# -- a compressed answer: an output bound, slices, relay as sent past the bound -------------------------


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate"])
def test_a_decompression_bomb_is_relayed_as_sent_with_bounded_memory(upstream: Any, pin: Any, coding: str) -> None:
    bomb = hostile.bomb(coding)  # 256 MiB of zeros in 405 B (br) to 255 KiB (gzip)
    half = len(bomb) // 2
    first_half, go = threading.Event(), threading.Event()

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b"bomb" not in req.body:
                conn.send(raw.json_response())
                continue
            answer = raw.json_response(bomb, extra=b"content-encoding: %s\r\n" % coding.encode())
            conn.send(answer[: len(answer) - half])
            first_half.set()
            go.wait(30)
            conn.send(answer[len(answer) - half :])

    proc, base = pin(upstream(script).url, {"limits": {"max_decoded_bytes": 8 * MiB}})
    warm(base)
    with Watch(proc.popen.pid) as memory:
        got: list[tuple[bytes, bytes]] = []
        client = threading.Thread(
            target=lambda: got.append(exchange(base, post(b"/v1/chat/completions", CHAT.replace(b"hi", b"bomb"))))
        )
        client.start()
        assert first_half.wait(30)
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200  # while the bomb is in
        go.set()
        client.join(60)
    ((head, body),) = got
    assert head.startswith(b"HTTP/1.1 200")
    assert header(head, b"content-encoding") == coding.encode() and body == bomb  # as the upstream sent it
    assert header(head, b"x-prefixpin-role") is not None
    assert memory.growth < 48 * MiB, f"prefixpin's peak memory grew by {memory.growth / MiB:.0f} MiB"
    assert metric(base, 'prefixpin_fail_open_total{stage="decode"} 1.0')


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate"])
def test_a_compressed_answer_under_the_bound_is_decoded_and_read(upstream: Any, pin: Any, coding: str) -> None:
    reply = raw.JSON_REPLY[:-1] + b',"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}'
    up = upstream(
        answering(raw.json_response(hostile.packed(coding, reply), extra=b"content-encoding: %s\r\n" % coding.encode()))
    )
    _, base = pin(up.url)
    head, body = exchange(base, post(b"/v1/chat/completions", CHAT))
    assert head.startswith(b"HTTP/1.1 200") and body == reply and header(head, b"content-encoding") is None
    assert metric(base, 'prefixpin_prompt_tokens_total{model="m",role="root"} 7.0')


# -- corrupt or cut encodings: a 502 in the API's shape, never a relabelled or shortened body -------------


CORRUPT = {
    "gzip label on plain bytes": (b"gzip", raw.JSON_REPLY),
    "gzip cut short": (b"gzip", hostile.packed("gzip", raw.JSON_REPLY * 50)[:-40]),
    "br label on plain bytes": (b"br", raw.JSON_REPLY),
    "br cut short": (b"br", hostile.packed("br", raw.JSON_REPLY * 50)[:-3]),
    "deflate label on plain bytes": (b"deflate", raw.JSON_REPLY),
}


@pytest.mark.parametrize("case", list(CORRUPT))
@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_a_corrupt_or_cut_encoding_is_a_502_in_the_apis_shape(upstream: Any, pin: Any, case: str, path: bytes) -> None:
    coding, data = CORRUPT[case]
    up = upstream(answering(raw.json_response(data, extra=b"content-encoding: " + coding + b"\r\n")))
    _, base = pin(up.url)
    head, body = exchange(base, post(path, MESSAGES if path == b"/v1/messages" else CHAT))
    assert head.startswith(b"HTTP/1.1 502")
    error = orjson.loads(body)
    if path == b"/v1/messages":  # Anthropic's shape
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "corrupt" in error["error"]["message"]
    else:
        assert error["error"]["code"] == "upstream_bad_encoding" and "corrupt" in error["error"]["message"]
    assert metric(base, 'prefixpin_upstream_errors_total{kind="encoding"} 1.0')


def _sse(events: list[bytes]) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events)


def _stream_head(coding: bytes) -> bytes:
    return hostile.head(
        b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked", b"content-encoding: " + coding
    )


def test_a_compressed_stream_cut_short_in_its_coding_ends_with_an_error_event(upstream: Any, pin: Any) -> None:
    whole = hostile.packed("gzip", _sse(raw.STREAM_EVENTS))
    up = upstream(answering(_stream_head(b"gzip") + hostile.chunk(whole[:-12]) + b"0\r\n\r\n"))
    _, base = pin(up.url)
    head, body = exchange(base, post(b"/v1/chat/completions", STREAM))
    assert head.startswith(b"HTTP/1.1 200") and header(head, b"content-encoding") is None
    events = [e for e in body.split(b"\n\n") if e]
    assert events[0] == b"data: " + raw.STREAM_EVENTS[0]  # what was whole went out
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_bad_encoding"
    assert metric(base, 'prefixpin_upstream_errors_total{kind="encoding"} 1.0')


def test_a_stream_corrupt_from_its_first_byte_is_a_502(upstream: Any, pin: Any) -> None:
    up = upstream(answering(_stream_head(b"br") + hostile.chunk(_sse(raw.STREAM_EVENTS)) + b"0\r\n\r\n"))
    _, base = pin(up.url)
    head, body = exchange(base, post(b"/v1/chat/completions", STREAM))
    assert head.startswith(b"HTTP/1.1 502") and orjson.loads(body)["error"]["code"] == "upstream_bad_encoding"


# -- an SSE event bound ------------------------------------------------------------------------------------


def test_a_compressed_stream_bomb_is_relayed_as_sent(upstream: Any, pin: Any) -> None:
    bomb = hostile.bomb("gzip", fill=b"data: ")  # one event that never ends, 256 MiB once inflated
    up = upstream(streaming(_stream_head(b"gzip") + hostile.chunk(bomb) + b"0\r\n\r\n"))
    proc, base = pin(up.url, {"limits": {"max_event_bytes": 1 * MiB}})
    warm(base)
    with Watch(proc.popen.pid) as memory:
        head, body = exchange(base, post(b"/v1/chat/completions", STREAM))
    assert head.startswith(b"HTTP/1.1 200") and header(head, b"content-encoding") == b"gzip" and body == bomb
    assert memory.growth < 48 * MiB, f"prefixpin's peak memory grew by {memory.growth / MiB:.0f} MiB"
    assert metric(base, 'prefixpin_fail_open_total{stage="decode"} 1.0')


def test_an_unterminated_sse_line_costs_no_more_than_the_event_bound(upstream: Any, pin: Any) -> None:
    first = b"data: " + raw.STREAM_EVENTS[0] + b"\n\n"
    line = b"data: " + b"x" * (64 * MiB)  # 64 MiB without a line end, sent a MiB at a time

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b'"stream":true' not in req.body:
                conn.send(raw.json_response())
                continue
            conn.send(hostile.head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked"))
            conn.send(hostile.chunk(first))
            for at in range(0, len(line), MiB):
                conn.send(hostile.chunk(line[at : at + MiB]))
            conn.send(hostile.chunk(b"\n\n") + b"0\r\n\r\n")

    proc, base = pin(upstream(script).url, {"limits": {"max_event_bytes": 1 * MiB}})
    warm(base)
    with Watch(proc.popen.pid) as memory:
        head, body = exchange(base, post(b"/v1/chat/completions", STREAM))
    assert head.startswith(b"HTTP/1.1 200") and body == first + line + b"\n\n"  # the rest as it came
    assert memory.growth < 40 * MiB, f"prefixpin's peak memory grew by {memory.growth / MiB:.0f} MiB"
    assert metric(base, 'prefixpin_fail_open_total{stage="decode"} 1.0')


# -- the upstream's response head ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [256 * 1024, 16 * MiB])
def test_an_upstream_head_over_the_bound_is_a_502(upstream: Any, pin: Any, size: int) -> None:
    def script(conn: raw.Conn) -> None:
        if conn.read_request() is None:
            return
        conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-big: ")
        for _ in range(size // (64 * 1024)):
            conn.send(b"a" * 64 * 1024)
        conn.send(b"\r\ncontent-length: 2\r\n\r\n{}")

    proc, base = pin(upstream(script).url)
    warm(base)
    with Watch(proc.popen.pid) as memory:
        head, body = exchange(base, post(b"/v1/chat/completions", CHAT))
    assert head.startswith(b"HTTP/1.1 502")
    error = orjson.loads(body)["error"]
    assert error["code"] == "upstream_protocol_error" and "limits.max_header_bytes" in error["message"]
    assert memory.growth < 24 * MiB


def test_an_upstream_head_within_the_bound_passes(upstream: Any, pin: Any) -> None:
    up = upstream(answering(raw.json_response(extra=b"x-big: " + b"a" * 60_000 + b"\r\n")))
    _, base = pin(up.url)
    head, _ = exchange(base, post(b"/v1/chat/completions", CHAT))
    assert head.startswith(b"HTTP/1.1 200") and len(header(head, b"x-big") or b"") == 60_000


# -- TLS to a plain-HTTP upstream, non-ASCII hosts -------------------------------------------------------


@pytest.mark.parametrize("answers", [True, False], ids=["plain-answers", "plain-silent"])
def test_https_to_a_plain_http_upstream_is_named_a_tls_mismatch(upstream: Any, pin: Any, answers: bool) -> None:
    def script(conn: raw.Conn) -> None:  # a plain-HTTP server: waits for a request line
        if answers:
            conn.sock.recv(65536)
            conn.send(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        else:
            conn.hang()

    up = upstream(script)
    _, base = pin(f"https://127.0.0.1:{up.port}")
    # Well inside upstream.connect_timeout_s (10 s): the handshake's own deadline names it.
    r = httpx.post(base + "/v1/chat/completions", content=CHAT, timeout=9)
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "upstream_tls_error"
    assert "plain" in error["message"] and "http://" in error["message"]
    assert up.connections == 1  # not tried twice


def test_a_non_ascii_upstream_host_goes_out_in_its_idna_form(upstream: Any, pin: Any) -> None:
    proxy = upstream(answering(raw.json_response(b'{"data":[]}')))  # an egress proxy: it sees the host as sent
    _, base = pin("http://bücher.example:8080", {"upstream": {"proxy": proxy.url}})
    r = httpx.get(base + "/v1/models", timeout=10)
    assert r.status_code == 200
    (req,) = proxy.requests
    assert req.target == "http://xn--bcher-kva.example:8080/v1/models"
    assert req.header("host") == "xn--bcher-kva.example:8080"


def test_a_host_without_an_ascii_form_is_a_config_error(tmp_path: Path, log_dir: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("upstream:\n  url: http://💩.example:8080\n", encoding="utf-8")
    proc = Proc("check-idna", [*prefixpin_argv(), "check-config", str(config)], log_dir)
    assert proc.popen.wait(30) == 2
    assert "upstream.url" in proc.log_tail() and "IDNA" in proc.log_tail()
    proc.stop()


def test_a_corrupt_body_is_logged_once_without_a_traceback(upstream: Any, pin: Any) -> None:
    up = upstream(answering(raw.json_response(raw.JSON_REPLY, extra=b"content-encoding: gzip\r\n")))
    proc, base = pin(up.url)
    assert httpx.post(base + "/v1/chat/completions", content=CHAT, timeout=10).status_code == 502
    wait_until(lambda: "corrupt" in proc.log_tail(200), message="the failure is logged")
    log = proc.log_tail(200)
    assert log.count("corrupt") == 1 and "Traceback" not in log


@pytest.mark.parametrize("name", ["127.1", "this machine's name"])
def test_an_upstream_that_resolves_to_prefixpin_itself_is_a_502_at_once(log_dir: Path, name: str) -> None:
    """An upstream URL whose host the config check cannot judge (it resolves no names)
    but that reaches prefixpin's own listening address: the request is answered at once
    with a 502 that names the mistake, and nothing loops (prefixpin counts one request,
    and the connection to itself carried no byte)."""
    host = name
    if name != "127.1":
        host = socket.gethostname()
        try:
            found = {a[4][0] for a in socket.getaddrinfo(host, None, socket.AF_INET)}
        except OSError:
            pytest.skip(f"this machine's name {host!r} does not resolve")
        if "127.0.0.1" not in found:
            pytest.skip(f"this machine's name {host!r} resolves to {sorted(found)}, not 127.0.0.1")
    port = free_port()
    argv = [*prefixpin_argv(), "serve", "--upstream", f"http://{host}:{port}", "--port", str(port)]
    proc = Proc(f"prefixpin-{port}", argv, log_dir, env={"PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(base + "/healthz", timeout=30)
        headers = {"content-type": "application/json", "authorization": "Bearer sk-test"}
        r = httpx.post(base + "/v1/chat/completions", content=CHAT, headers=headers, timeout=30)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["code"] == "upstream_is_prefixpin", error
        assert "prefixpin itself" in error["message"] and "point the upstream URL" in error["message"], error
        assert host not in error["message"]  # the client is not told the upstream's address
        metrics = httpx.get(base + "/metrics", timeout=10).text
        assert 'prefixpin_upstream_errors_total{kind="connect"} 1.0' in metrics
        served = [
            ln for ln in metrics.splitlines() if ln.startswith("prefixpin_requests_total{") and ln.endswith(" 1.0")
        ]
        assert len(served) == 1 and 'status="502"' in served[0], served  # one request: it did not come back
        assert "where this process listens" in proc.log_tail(20)  # the operator is told where it went
    finally:
        proc.stop()
