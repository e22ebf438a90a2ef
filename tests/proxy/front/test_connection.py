"""prefixpin's HTTP/1.1 server (proxy.front), served for real on a socket in front of a
small ASGI app that answers with what it was given: keep-alive, pipelining,
framing, the limits on heads, bodies and connections, trailers, Upgrade."""

from __future__ import annotations

import contextlib
import gc
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.front import Limits
from proxy.front.server import READ_BUFFER
from tests.infra.front import buffered_responses, closed, read_response, serving
from tests.infra.wait import wait_until


class Echo:
    """Answers ``METHOD raw_path len(body) body[:16]``; records each request's headers and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[tuple[bytes, bytes]], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        message = await receive()
        body = message["body"]
        assert not message["more_body"]  # the server hands over the whole body at once
        self.seen.append((list(scope["headers"]), body))
        query = scope["query_string"]
        if query == b"fail":
            raise RuntimeError("boom")
        if query.startswith(b"header="):  # a response header value the app took from its input
            value = bytes.fromhex(query[7:].decode())
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-echo", value)]})
            await send({"type": "http.response.body", "body": b"unsent"})
            return
        if query == b"chunked":  # no content-length: a streamed answer
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-seen", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            await send({"type": "http.response.body", "body": b"two"})
            return
        if query == b"cut":  # fails mid-body: the client must see the cut
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise RuntimeError("the upstream cut it")
        reply = b"%s %s %d " % (scope["method"].encode(), scope["raw_path"], len(body)) + body[:16]
        head = [(b"content-length", b"%d" % len(reply)), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": reply})


@pytest.fixture
def app() -> Echo:
    return Echo()


@pytest.fixture
def port(app: Echo) -> Iterator[int]:
    limits = Limits(max_header_bytes=8192, max_body_bytes=1 << 20, header_timeout_s=1, body_timeout_s=1)
    with serving(app, limits=limits, max_connections=8) as server:
        yield server.port  # type: ignore[attr-defined]


def _post(body: bytes, path: bytes = b"/v1/chat/completions", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n" % (path, len(body), extra) + body


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_keep_alive_carries_several_requests_with_their_whole_bodies(app: Echo, port: int) -> None:
    body = b'{"messages": []}' * 4000  # 64 KB: several reads
    with _connect(port) as sock:
        buf = bytearray()
        for _ in range(3):
            sock.sendall(_post(body))
            head, reply = read_response(sock, buf)
            assert head.startswith(b"HTTP/1.1 200 OK") and b"connection: close" not in head
            assert head.count(b"content-length") == 1
            assert reply == b"POST /v1/chat/completions %d " % len(body) + body[:16]
    assert [b for _, b in app.seen] == [body] * 3


def test_a_body_sent_in_pieces_is_served_once_whole(app: Echo, port: int) -> None:
    raw = _post(b"0123456789" * 1000)
    with _connect(port) as sock:
        for i in range(0, len(raw), 3000):
            sock.sendall(raw[i : i + 3000])
            time.sleep(0.01)  # a slow client on purpose: each piece arrives on its own
        read_response(sock, bytearray())
    assert [b for _, b in app.seen] == [b"0123456789" * 1000]


def test_bodies_past_the_read_buffer_on_two_connections_at_once_arrive_whole(app: Echo, port: int) -> None:
    # Every connection is read into the server's one read buffer: bodies longer than
    # it, sent in interleaved pieces on two connections, each arrive whole and unmixed.
    bodies = [bytes([65 + n]) * (READ_BUFFER + 50_000 * (n + 1)) for n in range(2)]
    raws = [_post(b) for b in bodies]
    with _connect(port) as one, _connect(port) as two:
        socks = (one, two)
        for i in range(0, max(map(len, raws)), 64_000):
            for sock, raw in zip(socks, raws, strict=True):
                if i < len(raw):
                    sock.sendall(raw[i : i + 64_000])
        replies = [read_response(sock, bytearray())[1] for sock in socks]
    assert replies == [b"POST /v1/chat/completions %d " % len(b) + b[:16] for b in bodies]
    assert sorted(b for _, b in app.seen) == bodies


def test_pipelined_requests_are_answered_in_order_even_to_a_slow_reader(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"first") + _post(b"second", path=b"/other") + _post(b"third"))
        # Read nothing until all three are answered (peeked at in the receive buffer).
        wait_until(lambda: buffered_responses(sock) == 3, timeout=5, message="three answers written, none read")
        buf = bytearray()
        replies = [read_response(sock, buf)[1] for _ in range(3)]
    assert replies == [
        b"POST /v1/chat/completions 5 first",
        b"POST /other 6 second",
        b"POST /v1/chat/completions 5 third",
    ]


def test_requests_pipelined_past_the_bound_are_refused_after_the_ones_before(app: Echo, port: int) -> None:
    """Each pipelined request waits parsed: one read of small requests would hold
    thousands.  The first ``MAX_WAITING`` are answered, the next gets a 503, and the
    connection closes."""
    from proxy.front.connection import MAX_WAITING

    get = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    with _connect(port) as sock:
        sock.sendall(get * (MAX_WAITING + 40))
        buf = bytearray()
        replies = [read_response(sock, buf) for _ in range(MAX_WAITING + 1)]
        assert closed(sock)
    assert all(head.startswith(b"HTTP/1.1 200") for head, _ in replies[:MAX_WAITING])
    head, body = replies[MAX_WAITING]
    assert head.startswith(b"HTTP/1.1 503") and b"too_many_pipelined_requests" in body
    assert len(app.seen) == MAX_WAITING


def test_trailer_fields_never_become_headers(app: Echo, port: int) -> None:
    raw = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntrailer: x-injected\r\n\r\n"
        b"2\r\n{}\r\n0\r\nx-injected: 1\r\nauthorization: Bearer victim\r\nx-prefixpin-bypass: 1\r\n\r\n"
    )
    with _connect(port) as sock:
        sock.sendall(raw + _post(b"next"))
        buf = bytearray()
        assert read_response(sock, buf)[1].endswith(b" 2 {}")
        assert read_response(sock, buf)[1].endswith(b" 4 next")
    headers, body = app.seen[0]
    names = [k for k, _ in headers]
    assert body == b"{}"
    assert b"x-injected" not in names and b"authorization" not in names and b"x-prefixpin-bypass" not in names


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_upgrade_is_ignored_the_body_kept_and_the_next_request_answered(app: Echo, port: int, chunked: bool) -> None:
    if chunked:
        first = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n"
            b"upgrade: h2c\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
    else:
        first = _post(b"hello", extra=b"connection: Upgrade\r\nupgrade: websocket\r\n")
    get = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
    with _connect(port) as sock:
        sock.sendall(first + get + _post(b"third"))
        buf = bytearray()
        replies = [read_response(sock, buf) for _ in range(3)]
    assert [r[1] for r in replies] == [
        b"POST /v1/chat/completions 5 hello",
        b"GET /v1/models 0 ",
        b"POST /v1/chat/completions 5 third",
    ]
    assert all(r[0].startswith(b"HTTP/1.1 200") for r in replies)  # never 101


def test_a_head_over_the_limit_is_431_and_closes(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 9000 + b"\r\n\r\n")
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 431") and b"max_header_bytes" in body
        assert closed(sock)
    assert app.seen == []


def test_a_header_flood_is_cut_early_and_costs_the_flood_only(app: Echo, port: int) -> None:
    """Megabytes of one header line: answered 431 once the limit is passed (not buffered
    to the end), and the server keeps serving others."""
    sent = 0
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-flood: ")
        with pytest.raises(OSError):  # reset or broken pipe once the server has closed
            for _ in range(4096):
                sock.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 8 << 20
    with _connect(port) as sock:
        sock.sendall(_post(b"ok"))
        assert read_response(sock, bytearray())[1].endswith(b" 2 ok")


def test_many_idle_connections_never_starve_a_new_one(app: Echo, port: int) -> None:
    """Past ``max_connections`` (8 here) the oldest idle connections are closed to make
    room: a health check on a new connection is answered."""
    idle = [_connect(port) for _ in range(12)]
    for s in idle[:6]:
        s.sendall(b"G")  # a request begun and never finished (slowloris)
    try:
        with _connect(port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            head, reply = read_response(sock, bytearray())
            assert head.startswith(b"HTTP/1.1 200") and reply == b"GET /healthz 0 "
        assert sum(closed(s, 0.5) for s in idle) >= 5
    finally:
        for s in idle:
            s.close()


def test_when_every_connection_is_busy_a_new_one_gets_503() -> None:
    class Hold(Echo):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                await receive()
                await receive()  # until the client leaves
                return
            await super().__call__(scope, receive, send)

    with serving(Hold(), max_connections=2) as server:
        port = server.port  # type: ignore[attr-defined]
        busy = [_connect(port) for _ in range(2)]
        for s in busy:
            s.sendall(_post(b"{}"))
        wait_until(lambda: len(server.tasks) == 2, timeout=5, interval=0.01, message="both requests are served")
        with _connect(port) as sock:
            head, body = read_response(sock, bytearray())
            assert head.startswith(b"HTTP/1.1 503") and b"max_connections" in body
        for s in busy:
            s.close()


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 2000000\r\n\r\n")
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in body
    assert app.seen == []


def test_a_chunked_body_over_the_limit_is_413(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(OSError):  # the server may close before all of it is sent
            for _ in range(64):
                sock.sendall(b"8000\r\n" + b"a" * 0x8000 + b"\r\n")
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in body
    assert app.seen == []


def test_100_continue_is_answered_then_the_body_read(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n")
        buf = bytearray()
        head, _ = read_response(sock, buf)
        assert head.startswith(b"HTTP/1.1 100")
        sock.sendall(b"{}")
        assert read_response(sock, buf)[1] == b"POST /v1/x 2 {}"


def test_a_slow_head_gets_408(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\n")
        head, _ = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 408")
        assert closed(sock)


def test_a_stalled_body_gets_408(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in body
    assert app.seen == []


def test_an_idle_keep_alive_connection_is_closed() -> None:
    with serving(Echo(), limits=Limits(keepalive_timeout_s=0.2)) as server, _connect(server.port) as sock:  # type: ignore[attr-defined]
        sock.sendall(_post(b"{}"))
        read_response(sock, bytearray())
        assert closed(sock, 3)


def test_a_keep_alive_connection_in_use_stays_open_past_its_idle_timeout() -> None:
    """Each request moves the idle deadline: requests 0.1 s apart keep a connection whose
    keep-alive timeout is 0.3 s open for longer than that, and once they stop it closes."""
    with serving(Echo(), limits=Limits(keepalive_timeout_s=0.3)) as server, _connect(server.port) as sock:  # type: ignore[attr-defined]
        for _ in range(6):
            sock.sendall(_post(b"{}"))
            head, _ = read_response(sock, bytearray())
            assert head.startswith(b"HTTP/1.1 200")
            time.sleep(0.1)
        assert closed(sock, 3)


def test_a_head_that_starts_on_an_idle_connection_gets_its_own_shorter_deadline() -> None:
    """An idle connection's timer is due later than a head's deadline: the head's comes first."""
    limits = Limits(keepalive_timeout_s=30, header_timeout_s=0.2)
    with serving(Echo(), limits=limits) as server, _connect(server.port) as sock:  # type: ignore[attr-defined]
        sock.sendall(b"POST /v1/x HTTP/1.1\r\nhost: x\r\n")
        sock.settimeout(5)
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in body


def test_a_new_connection_that_sends_nothing_is_closed_as_an_idle_one() -> None:
    """``header_timeout_s`` runs from a head's first byte; before it, a new connection
    is idle and gets ``keepalive_timeout_s``, and is closed without a response."""
    limits = Limits(keepalive_timeout_s=0.2, header_timeout_s=60)
    with serving(Echo(), limits=limits) as server, _connect(server.port) as sock:  # type: ignore[attr-defined]
        sock.settimeout(3)
        assert sock.recv(65536) == b""  # closed well before header_timeout_s, nothing written


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        b"POST /x HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n folded\r\ncontent-length: 2\r\n\r\n{}",
        b"POST /x HTTP/1.1\nhost: x\ncontent-length: 2\n\n{}",
        b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ],
    ids=["cl+te", "two-cl", "obs-fold", "bare-lf", "te-list", "te-not-last-chunked"],
)
def test_smuggling_framings_are_400_and_reach_no_app(app: Echo, port: int, raw: bytes) -> None:
    with _connect(port) as sock:
        sock.sendall(raw + _post(b"smuggled"))
        head, _ = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 400")
        assert closed(sock)
    assert app.seen == []


def test_http_1_0_gets_its_answer_and_a_close(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}")
        head, _ = read_response(sock, bytearray())
        assert b"connection: close" in head.lower()
        assert closed(sock)


def test_a_head_request_gets_the_head_only(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"HEAD /v1/models HTTP/1.1\r\nhost: x\r\n\r\n" + _post(b"after"))
        buf = bytearray()
        sock.settimeout(5)
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"  # else this loop would spin
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 18" in head  # "HEAD /v1/models 0 "
        buf = bytearray(rest)
        assert read_response(sock, buf)[1].endswith(b" 5 after")  # no body came between


def test_a_streamed_answer_is_chunked(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?chunked"))
        head, body = read_response(sock, bytearray())
    assert b"x-seen: 2" in head and b"transfer-encoding: chunked" in head
    assert body == b"4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"


def test_an_app_that_fails_before_answering_gives_a_500(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?fail"))
        head, body = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 500") and body == b"Internal Server Error"


@pytest.mark.parametrize("value", [b"a\r\nset-cookie: x=1", b"a\nb", b"a\rb", b"a\0b", b"\n"])
def test_a_response_header_holding_a_line_break_or_nul_is_never_sent(port: int, value: bytes) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?header=" + value.hex().encode()))
        data = b""
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    assert b"x-echo" not in data and b"set-cookie" not in data and b"unsent" not in data  # the response is cut


def test_an_app_that_fails_mid_body_cuts_the_response(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?cut"))
        data = b""
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    assert b"partial" in data and not data.endswith(b"0\r\n\r\n")  # no terminating chunk


def test_a_client_that_leaves_mid_body_costs_nothing(app: Echo, port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(_post(b"x" * 10_000)[:5000])
    with _connect(port) as sock:
        sock.sendall(_post(b"ok"))
        assert read_response(sock, bytearray())[1].endswith(b" 2 ok")
    assert [b for _, b in app.seen] == [b"ok"]


class _Mark:
    """Put in a request's scope: dead once nothing refers to the scope any more."""


def test_a_served_request_leaves_no_cycle_for_the_garbage_collector() -> None:
    # Each scope is freed by reference counting once its request is answered: nothing
    # of it waits for a collection, which would stall the event loop over every request.
    marks: list[weakref.ref[_Mark]] = []
    echo = Echo()

    async def marked(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            mark = _Mark()
            marks.append(weakref.ref(mark))
            scope["mark"] = mark
        await echo(scope, receive, send)

    gc.disable()
    try:
        with serving(marked) as server, _connect(server.port) as sock:  # type: ignore[attr-defined]
            buf = bytearray()
            for _ in range(4):
                sock.sendall(_post(b'{"messages": []}'))
                assert read_response(sock, buf)[0].startswith(b"HTTP/1.1 200 OK")
            wait_until(
                lambda: all(m() is None for m in marks[:3]), timeout=5, interval=0.01, message="the scopes are freed"
            )
    finally:
        gc.enable()
