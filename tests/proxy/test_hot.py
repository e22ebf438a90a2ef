"""The hot route of prefixpin's protocol (proxy.server.HotCycle), served for real by
uvicorn on a socket: which requests take it, which go the ordinary way, and that
both answer the same bytes."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from proxy.server import ABORT, CORK, WATCH, protocol
from tests.infra.procs import free_port


class _Front:
    """Stands for proxy.app.Front: ``hot(path)`` and ``serve`` for the hot route,
    ``__call__`` (ASGI) for everything else; it answers with what it was sent."""

    def __init__(self, *, hot_limit: int = 1 << 20, hot_wait_s: float = 1.0) -> None:
        self.hot_limit = hot_limit
        self.hot_wait_s = hot_wait_s
        self.served: list[tuple[str, bytes]] = []  # (how, body)

    def hot(self, path: str) -> str | None:
        return "chat" if path == "/v1/chat/completions" else None

    async def serve(self, scope: Any, body: bytes, receive: Any, send: Any, exchange: str) -> None:
        assert exchange == "chat" and scope["method"] == "POST"
        assert set(scope["extensions"]) >= {ABORT, CORK, WATCH}
        self.served.append(("hot", body))
        await self._answer(scope, body, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.served.append(("ordinary", body))
        await self._answer(scope, body, send)

    async def _answer(self, scope: Any, body: bytes, send: Any) -> None:
        query = scope["query_string"]
        if query == b"fail":
            raise RuntimeError("boom")
        if query == b"chunked":  # no content-length: a streamed answer
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-seen", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            await send({"type": "http.response.body", "body": b"two"})
            return
        reply = b"%s %s %d " % (scope["method"].encode(), scope["raw_path"], len(body)) + body[:16]
        head = [(b"content-length", b"%d" % len(reply)), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": reply})


@pytest.fixture
def front() -> _Front:
    return _Front()


@pytest.fixture
def server(front: _Front) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        front, host="127.0.0.1", port=port, http=protocol(5.0), log_level="critical", proxy_headers=False
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)


def _post(body: bytes, path: bytes = b"/v1/chat/completions", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n" % (path, len(body), extra) + body


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """One response (content-length or chunked) off ``sock``; ``buf`` keeps what follows."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    del buf[:]
    buf += rest
    lines = head.lower().split(b"\r\n")
    if head.startswith(b"HTTP/1.1 100"):
        return head, b""
    length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:")), None)
    if length is None:
        assert b"transfer-encoding: chunked" in lines
        while not bytes(buf).find(b"0\r\n\r\n") >= 0:
            chunk = sock.recv(65536)
            assert chunk
            buf += chunk
        end = bytes(buf).index(b"0\r\n\r\n") + 5
        body, rest = bytes(buf[:end]), bytes(buf[end:])
    else:
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection mid-body"
            buf += chunk
        body, rest = bytes(buf[:length]), bytes(buf[length:])
    del buf[:]
    buf += rest
    return head, body


def test_a_post_to_an_exchange_is_served_hot_with_its_whole_body(front: _Front, server: int) -> None:
    body = b'{"messages": []}' * 4000  # 64 KB: several reads
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        buf = bytearray()
        for _ in range(3):  # keep-alive: three requests on one connection
            sock.sendall(_post(body))
            head, reply = _read_response(sock, buf)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert b"connection: close" not in head
            assert reply == b"POST /v1/chat/completions %d " % len(body) + body[:16]
    assert front.served == [("hot", body)] * 3


class _Mark:
    """Put in a request's scope: dead once nothing refers to the scope any more."""


def test_a_served_request_leaves_no_cycle_for_the_garbage_collector(front: _Front, server: int) -> None:
    # Each scope is freed by reference counting as soon as the next request replaces
    # it: nothing of it (its headers, its hooks) waits for a collection, which would
    # stall the event loop over every request since the last one.
    marks: list[weakref.ref[_Mark]] = []
    serve = front.serve

    async def marked(scope: Any, body: bytes, receive: Any, send: Any, exchange: str) -> None:
        mark = _Mark()
        marks.append(weakref.ref(mark))
        scope["mark"] = mark
        await serve(scope, body, receive, send, exchange)

    front.serve = marked  # type: ignore[method-assign]
    gc.disable()
    try:
        with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
            buf = bytearray()
            for _ in range(4):
                sock.sendall(_post(b'{"messages": []}'))
                head, _ = _read_response(sock, buf)
                assert head.startswith(b"HTTP/1.1 200 OK")
            assert len(marks) == 4
            deadline = time.monotonic() + 5
            while any(m() is not None for m in marks[:3]) and time.monotonic() < deadline:
                time.sleep(0.01)  # the server's thread finishes each request's task
            assert [m() is None for m in marks[:3]] == [True] * 3
    finally:
        gc.enable()


def test_a_body_sent_in_pieces_is_gathered_then_served_once(front: _Front, server: int) -> None:
    body = b"0123456789" * 1000
    raw = _post(body)
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        for i in range(0, len(raw), 3000):
            sock.sendall(raw[i : i + 3000])
            time.sleep(0.01)
        _head, reply = _read_response(sock, bytearray())
    assert reply.endswith(body[:16])
    assert front.served == [("hot", body)]


def test_a_body_slower_than_hot_wait_goes_the_ordinary_way_whole(server: int, front: _Front) -> None:
    front.hot_wait_s = 0.05
    body = b"a" * 5000 + b"b" * 5000
    raw = _post(body)
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(raw[:-5000])
        time.sleep(0.3)  # past hot_wait_s: uvicorn's cycle takes over with what arrived
        sock.sendall(raw[-5000:])
        head, _reply = _read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 200")
        sock.sendall(_post(b"next"))  # the connection carries on, hot again
        _, reply2 = _read_response(sock, bytearray())
    assert front.served == [("ordinary", body), ("hot", b"next")]
    assert reply2.endswith(b" 4 next")


def test_a_body_over_hot_limit_goes_the_ordinary_way_whole(server: int, front: _Front) -> None:
    front.hot_limit = 10_000
    body = bytes(range(256)) * 600  # 150 KB: uvicorn pauses reading past its high-water mark
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(_post(body))
        head, _reply = _read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 200")
    assert front.served == [("ordinary", body)]


@pytest.mark.parametrize(
    "raw",
    [
        _post(b"{}", path=b"/v1/models"),  # not an exchange's path
        b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n",  # not a POST
        _post(b"{}", path=b"/v1/chat%2Fcompletions"),  # escaped: uvicorn decodes it
        _post(b"{}", extra=b"expect: 100-continue\r\n"),  # uvicorn answers the 100
    ],
)
def test_other_requests_go_the_ordinary_way(server: int, front: _Front, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(raw)
        buf = bytearray()
        head, _ = _read_response(sock, buf)
        if head.startswith(b"HTTP/1.1 100"):
            head, _ = _read_response(sock, buf)
    assert head.startswith(b"HTTP/1.1 200")
    assert [how for how, _ in front.served] == ["ordinary"]


def test_pipelined_requests_are_answered_in_order(server: int, front: _Front) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(_post(b"first") + _post(b"second", path=b"/other") + _post(b"third"))
        buf = bytearray()
        replies = [_read_response(sock, buf)[1] for _ in range(3)]
    assert replies == [
        b"POST /v1/chat/completions 5 first",
        b"POST /other 6 second",
        b"POST /v1/chat/completions 5 third",
    ]
    assert [body for _, body in front.served] == [b"first", b"second", b"third"]
    assert front.served[0][0] == "hot"


def test_http_1_0_gets_its_answer_and_a_close(server: int, front: _Front) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}")
        head, _reply = _read_response(sock, bytearray())
        assert b"connection: close" in head.lower()
        assert sock.recv(10) == b""  # closed
    assert front.served == [("hot", b"{}")]


def test_a_streamed_answer_is_chunked(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?chunked"))
        head, body = _read_response(sock, bytearray())
    assert b"x-seen: 2" in head
    assert body == b"4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"


def test_an_app_that_fails_before_answering_gives_a_500(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(_post(b"{}", path=b"/v1/chat/completions?fail"))
        head, body = _read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 500") and body == b"Internal Server Error"


def test_a_client_that_leaves_mid_body_costs_nothing(server: int, front: _Front) -> None:
    raw = _post(b"x" * 10_000)
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(raw[:5000])
    time.sleep(0.1)
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:  # the server still serves
        sock.sendall(_post(b"ok"))
        _, reply = _read_response(sock, bytearray())
    assert reply.endswith(b" 2 ok")
    assert front.served == [("hot", b"ok")]
