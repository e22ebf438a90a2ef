"""Bounded edges, the client's side (SPEC section 2i), against a real ``prefixpin serve``
on raw sockets: a client that does not read pauses the upstream (memory stays bounded),
a request target that is not a path gets a 400 (pipelined too), every response carries
one ``Date``, SIGTERM gives requests ``listen.shutdown_grace_s`` and ends the streams
still open with an error event, and ports are checked before anything starts."""

from __future__ import annotations

import hashlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.infra import hostile, tcp
from tests.infra import rawupstream as raw
from tests.infra.front import read_response
from tests.infra.hostile import MiB
from tests.infra.memory import Watch
from tests.infra.procs import Proc, free_port, prefixpin_argv, start_prefixpin
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

STREAM = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
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
    procs: list[Proc] = []

    def start(url: str, config: dict[str, Any] | None = None) -> tuple[Proc, str]:
        path = write_config(config) if config else None
        proc, base = start_prefixpin(log_dir, upstream=url, config=path, name=f"prefixpin-{free_port()}")
        procs.append(proc)
        return proc, base

    yield start
    for proc in procs:
        proc.stop()


def connect(base: str, rcvbuf: int = 0) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window stays small
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n%s" % (path, extra)
    return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)


def read_all(sock: socket.socket) -> bytes:
    parts = []
    while data := sock.recv(1 << 20):
        parts.append(data)
    return b"".join(parts)


# -- write backpressure, end to end -------------------------------------------------------------------


PIECE = 256 * 1024
TOTAL = 64 * MiB


def _event(i: int) -> bytes:
    text = b"%08d" % i + b"x" * (PIECE - 64)
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text + b'"}}]}\n\n'


@pytest.mark.parametrize("route", ["passthrough", "chat"])
def test_a_client_that_does_not_read_pauses_the_upstream(upstream: Any, pin: Any, route: str) -> None:
    """64 MiB streamed to a client that reads nothing: prefixpin stops reading the upstream
    (its socket's receive queue fills) and holds a bounded amount meanwhile; then the
    client reads it all, every byte in order.  (On the chat route the reply machine
    stops reading past limits.max_decoded_bytes: what it keeps of a reply grows with it.)"""
    finished = threading.Event()
    digest = hashlib.sha256()

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b"stream" not in req.body and not req.line.startswith(b"GET /big"):
                conn.send(raw.json_response())
                continue
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            conn.send(hostile.head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked"))
            for i in range(TOTAL // PIECE):
                event = _event(i)
                digest.update(event)
                conn.send(hostile.chunk(event))
            conn.send(b"0\r\n\r\n")
            finished.set()

    up = upstream(script)
    proc, base = pin(up.url, {"limits": {"max_decoded_bytes": 8 * MiB}})
    httpx.post(base + "/v1/chat/completions", content=CHAT, timeout=10)  # warm
    request = post(b"/v1/chat/completions", STREAM) if route == "chat" else b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n"

    def upstream_backs_up() -> bool:  # prefixpin's side of the upstream connection has unread bytes
        return any(s.remote_port == up.port and s.unread >= 64 * 1024 for s in tcp.sockets())

    with Watch(proc.popen.pid) as memory, connect(base, rcvbuf=16 * 1024) as sock:
        sock.sendall(request)
        wait_until(lambda: finished.is_set() or upstream_backs_up(), timeout=30, message="the upstream is paused")
        assert not finished.is_set(), "the upstream sent all 64 MiB to a client that reads nothing"
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        head, data = _read_stream(sock)
    assert head.startswith(b"HTTP/1.1 200")
    assert len(data) == sum(len(_event(i)) for i in range(TOTAL // PIECE))
    assert hashlib.sha256(data).hexdigest() == digest.hexdigest()
    assert memory.growth < 32 * MiB, f"prefixpin's peak memory grew by {memory.growth / MiB:.0f} MiB"


def _read_stream(sock: socket.socket) -> tuple[bytes, bytes]:
    """A chunked stream's head and data, read as it comes (no quadratic buffering)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    out, buf = [], bytearray(rest)
    while True:
        while b"\r\n" not in buf[:20]:
            buf += sock.recv(1 << 20)
        line_end = buf.index(b"\r\n")
        size = int(bytes(buf[:line_end]), 16)
        while len(buf) < line_end + 4 + size:
            buf += sock.recv(1 << 20)
        if size == 0:
            return head, b"".join(out)
        out.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
        del buf[: line_end + 4 + size]


# -- targets that are not a path -------------------------------------------------------------------------


BAD_TARGETS = [
    b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
    b"GET http://a:b:c/ HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET http://[::1/x HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET http://x:99999999/ HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET http:///nohost HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET ftp://x/y HTTP/1.1\r\nhost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
]


@pytest.mark.parametrize("request_", BAD_TARGETS, ids=lambda r: r.split(b"\r\n")[0].decode())
@pytest.mark.parametrize("pipelined", [False, True], ids=["alone", "behind-healthz"])
def test_a_target_that_is_not_a_path_is_400_with_one_log_line(
    upstream: Any, pin: Any, request_: bytes, pipelined: bool
) -> None:
    up = upstream(raw.answer_json)
    proc, base = pin(up.url)
    with connect(base) as sock:
        sock.sendall((b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" if pipelined else b"") + request_)
        buf = bytearray()
        if pipelined:
            head, body = read_response(sock, buf)
            assert head.startswith(b"HTTP/1.1 200") and body
        head, body = read_response(sock, buf)
        assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head
        assert orjson.loads(body)["error"]["code"] == "invalid_request"
        assert not buf and sock.recv(1) == b""  # then closed
    assert not up.requests
    wait_until(lambda: "not a path" in proc.log_tail(100), message="the refusal is logged")
    log = proc.log_tail(100)
    assert log.count("not a path") == 1 and "Traceback" not in log


def test_an_absolute_form_target_is_served_by_its_path(upstream: Any, pin: Any) -> None:
    up = upstream(raw.answer_json)
    _, base = pin(up.url)
    with connect(base) as sock:
        sock.sendall(b"GET http://elsewhere.example:8080/v1/models?x=1 HTTP/1.1\r\nhost: x\r\n\r\n")
        head, _ = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 200")
    assert up.requests[0].target == "/v1/models?x=1"  # the configured upstream, never the target's host


# -- Date ---------------------------------------------------------------------------------------------------


def _dates(head: bytes) -> list[bytes]:
    return [line for line in head.split(b"\r\n") if line.lower().startswith(b"date:")]


def test_every_response_carries_one_date(upstream: Any, pin: Any) -> None:
    up = upstream(raw.answer_json)  # sends no Date
    _, base = pin(up.url)
    requests = [
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n",
        post(b"/v1/chat/completions", CHAT),
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /x HTTP/1.1\r\nhost: x\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n",  # the server's own 431
    ]
    for request in requests:
        with connect(base) as sock:
            sock.sendall(request)
            head, _ = read_response(sock, bytearray())
        assert len(_dates(head)) == 1, head
        assert _dates(head)[0].endswith(b" GMT")


def test_the_upstreams_date_is_kept_once(upstream: Any, pin: Any) -> None:
    date = b"date: Tue, 01 Dec 2026 10:00:00 GMT"
    up = upstream(lambda c: [c.send(raw.json_response(extra=date + b"\r\n")) for _ in iter(c.read_request, None)])
    _, base = pin(up.url)
    with connect(base) as sock:
        sock.sendall(post(b"/v1/chat/completions", CHAT))
        head, _ = read_response(sock, bytearray())
    assert _dates(head) == [date]


# -- SIGTERM ------------------------------------------------------------------------------------------------


def _refused(base: str) -> bool:
    host, port = base.removeprefix("http://").split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_sigterm_ends_a_stream_past_the_grace_with_an_error_event(upstream: Any, pin: Any, path: bytes) -> None:
    first = b"data: " + raw.STREAM_EVENTS[0] + b"\n\n"

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b"stream" not in req.body:
                conn.send(raw.json_response())
                continue
            conn.send(hostile.head(b"200 OK", b"content-type: text/event-stream", b"transfer-encoding: chunked"))
            conn.send(hostile.chunk(first))
            conn.hang()  # a long generation

    proc, base = pin(upstream(script).url, {"listen": {"shutdown_grace_s": 1}})
    with connect(base) as sock:
        sock.sendall(post(path, STREAM))
        data = b""
        while first not in data:
            data += sock.recv(65536)
        proc.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: _refused(base), message="no new connection is accepted")
        data += read_all(sock)  # the grace, then the end
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    events = [e for e in hostile.dechunk(body).split(b"\n\n") if e]
    assert events[0] == first.strip()
    if path == b"/v1/messages":  # Anthropic's error event
        assert events[-1].startswith(b"event: error\ndata: ")
        error = orjson.loads(events[-1].partition(b"data: ")[2])
        assert error["type"] == "error" and "shutting down" in error["error"]["message"]
    else:
        assert orjson.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "server_shutdown"
    assert body.endswith(b"0\r\n\r\n")  # ended cleanly, not cut
    assert proc.popen.wait(30) == 0
    log = proc.log_tail(50)
    assert f'shutdown: "POST {path.decode()}" still running after 1 s: stream ended with an error event' in log


def test_sigterm_lets_a_request_in_flight_finish_within_the_grace(upstream: Any, pin: Any) -> None:
    go = threading.Event()
    arrived = threading.Event()

    def script(conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            if b"slow" in req.body:
                arrived.set()
                go.wait(30)
            conn.send(raw.json_response())

    proc, base = pin(upstream(script).url, {"listen": {"shutdown_grace_s": 30}})
    with connect(base) as sock:
        sock.sendall(post(b"/v1/chat/completions", CHAT.replace(b"hi", b"slow")))
        assert arrived.wait(30)
        proc.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: _refused(base), message="no new connection is accepted")
        go.set()
        head, body = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head and body == raw.JSON_REPLY
    assert proc.popen.wait(30) == 0
    assert "still running" not in proc.log_tail(50)


# -- ports ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--port", "70000"], "listen.port"),
        (["--port", "0"], "listen.port"),
        (["--upstream", "http://127.0.0.1:99999"], "upstream.url"),
        (["--upstream", "http://127.0.0.1:x/"], "upstream.url"),
    ],
)
def test_a_port_that_is_not_one_is_a_config_error(log_dir: Path, args: list[str], key: str) -> None:
    argv = [*prefixpin_argv(), "serve", *(["--upstream", "http://127.0.0.1:8080"] if "--upstream" not in args else [])]
    proc = Proc(f"ports-{free_port()}", [*argv, *args], log_dir)
    assert proc.popen.wait(30) == 2
    assert f"invalid configuration: {key}" in proc.log_tail()
    proc.stop()
