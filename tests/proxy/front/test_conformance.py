"""prefixpin's HTTP/1.1 server held to a library's standard: the cases of uvicorn's
protocol tests (tests/protocols/test_http.py) and h11's (test_io.py, test_headers.py,
test_connection.py) that apply to a server, plus the bounds of SPEC section 2i —
written afresh against ``proxy.front`` served on a real socket, raw bytes in and out.

Where we answer differently from them, on purpose, the test says so: we refuse
(400) what h11 or uvicorn's httptools protocol let through (obs-fold, bare LF,
CONNECT, a target that is not a path), bound what they do not (a response head's
size is ours to bound; a request head's is 431), never switch protocols, and add
``date`` to every response."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.front import Limits
from proxy.front.server import Server
from tests.infra.front import closed, read_response, serving
from tests.infra.wait import wait_until


class Scripted:
    """An ASGI app whose behaviour the request path's first segment picks (``/close`` ->
    ``_close``; anything else answers ``Body: <the request body>``)."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.progress = 0  # body bytes the app has sent (the backpressure test watches it)
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.scopes.append(scope)
        name = "_" + scope["path"].strip("/").split("/")[0].replace("-", "_")
        await getattr(self, name if name in _ROUTES else "_text")(scope, receive, send)

    async def _text(self, scope: Any, receive: Any, send: Any, headers: Any = ()) -> None:
        message = await receive()
        body = b"Body: " + message["body"]
        base = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": base + list(headers)})
        await send({"type": "http.response.body", "body": body})

    async def _chars(self, scope: Any, receive: Any, send: Any) -> None:  # uvicorn: header value characters
        value = scope["query_string"].replace(b"%09", b"\t").replace(b"%20", b" ").replace(b"%C2%B5", "µ".encode())
        await self._text(scope, receive, send, [(b"key", b"<" + value + b">")])

    async def _close(self, scope: Any, receive: Any, send: Any) -> None:  # the app says connection: close
        await send({"type": "http.response.start", "status": 204, "headers": [(b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b""})

    async def _chunked(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"transfer-encoding", b"chunked")]})
        await send({"type": "http.response.body", "body": b"Hello, ", "more_body": True})
        await send({"type": "http.response.body", "body": b"world!"})

    async def _empty_chunked(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _undersized(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"xxx"})

    async def _oversized(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"xxx" * 20})

    async def _raise(self, scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def _raise_mid_body(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1", "more_body": True})
        raise RuntimeError("boom")

    async def _nothing(self, scope: Any, receive: Any, send: Any) -> None:
        return

    async def _start_only(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def _splitting(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"key", b"value\r\nCookie: smuggled=value")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _two_starts(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def _no_start(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.body", "body": b""})

    async def _after_end(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        await send({"type": "http.response.body", "body": b""})

    async def _disconnect(self, scope: Any, receive: Any, send: Any) -> None:
        self.messages.append(await receive())
        self.messages.append(await receive())  # until the client leaves

    async def _read_after(self, scope: Any, receive: Any, send: Any) -> None:
        await self._text(scope, receive, send)
        self.messages.append(await receive())

    async def _iter_headers(self, scope: Any, receive: Any, send: Any) -> None:
        headers = iter([(b"x-test-header", b"test value")])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _dated(self, scope: Any, receive: Any, send: Any) -> None:
        await self._text(scope, receive, send, [(b"date", b"Tue, 01 Dec 2026 10:00:00 GMT")])

    async def _big(self, scope: Any, receive: Any, send: Any) -> None:  # 32 MiB, 256 KiB at a time
        await send({"type": "http.response.start", "status": 200, "headers": []})
        piece = b"x" * (256 * 1024)
        for _ in range(128):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            self.progress += len(piece)
        await send({"type": "http.response.body", "body": b""})

    async def _events(self, scope: Any, receive: Any, send: Any) -> None:  # a stream that waits
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await asyncio.sleep(3600)

    async def _slow(self, scope: Any, receive: Any, send: Any) -> None:  # answers once released
        await receive()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        await self._text(scope, self._empty, send)

    @staticmethod
    async def _empty() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}


_ROUTES = frozenset(n for n in vars(Scripted) if n.startswith("_") and not n.startswith("__"))


@pytest.fixture
def app() -> Scripted:
    return Scripted()


@pytest.fixture
def server(app: Scripted) -> Iterator[Server]:
    with serving(app, limits=Limits(max_header_bytes=16 * 1024, body_timeout_s=5, header_timeout_s=5)) as s:
        yield s


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # type: ignore[attr-defined]
    return sock


def _get(path: bytes = b"/", extra: bytes = b"", method: bytes = b"GET", version: bytes = b"1.1") -> bytes:
    return b"%s %s HTTP/%s\r\nHost: example.org\r\n%s\r\n" % (method, path, version, extra)


def _post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: example.org\r\ncontent-length: %d\r\n%s\r\n%s" % (path, len(body), extra, body)


def _exchange(server: Server, data: bytes) -> tuple[bytes, bytes]:
    with _connect(server) as sock:
        sock.sendall(data)
        return read_response(sock, bytearray())


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


# -- requests and answers (uvicorn: test_get_request ... test_post_request) ---------------------------------


def test_get_head_and_post(server: Server) -> None:
    head, body = _exchange(server, _get())
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b"Body: "
    head, body = _exchange(server, _post(b"/", b'{"hello": "world"}'))
    assert body == b'Body: {"hello": "world"}'


def test_head_gets_the_gets_headers_and_no_body(server: Server) -> None:  # h11: test_HEAD_framing_headers
    get_head, _ = _exchange(server, _get())
    with _connect(server) as sock:
        sock.sendall(_get(method=b"HEAD") + _get(b"/after"))
        data = b""
        while data.count(b"\r\n\r\n") < 2:
            data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 6" in head
    assert rest.startswith(b"HTTP/1.1 200 OK")  # no body between the two
    assert b"content-length: 6" in get_head


@pytest.mark.parametrize("char", ["c", "%09", "%20", "%C2%B5"], ids=["letter", "tab", "space", "non-ascii"])
def test_header_values_the_app_sends_pass_as_they_are(server: Server, char: str) -> None:
    head, _ = _exchange(server, _get(b"/chars?" + char.encode()))
    expected = {"c": b"c", "%09": b"\t", "%20": b" ", "%C2%B5": "µ".encode()}[char]
    assert b"\r\nkey: <" + expected + b">" in head + b"\r\n"


def test_the_raw_path_is_kept_and_the_path_decoded(server: Server, app: Scripted) -> None:
    _exchange(server, _get(b"/one%2Ftwo?x=%20"))
    scope = app.scopes[-1]
    assert scope["path"] == "/one/two" and scope["raw_path"] == b"/one%2Ftwo" and scope["query_string"] == b"x=%20"
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"} and scope["http_version"] == "1.1"


def test_an_http_1_0_request_is_answered_and_closed(server: Server, app: Scripted) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")  # no Host: legal in 1.0 (h11: test_readers_unusual)
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head and body == b"Body: "
        assert closed(sock)
    assert app.scopes[-1]["http_version"] == "1.0"


def test_headers_from_an_iterator(server: Server) -> None:
    head, _ = _exchange(server, _get(b"/iter-headers"))
    assert b"x-test-header: test value" in head


# -- keep-alive and close (uvicorn: test_keepalive, test_close, ...; h11: _keep_alive) ----------------------


def test_keep_alive_by_default(server: Server) -> None:
    with _connect(server) as sock:
        buf = bytearray()
        for _ in range(3):
            sock.sendall(_get())
            head, _ = read_response(sock, buf)
            assert b"connection: close" not in head.lower()


@pytest.mark.parametrize("value", [b"close", b"a, b, cLOse, foo"])
def test_connection_close_from_the_client_is_honoured(server: Server, value: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(extra=b"Connection: " + value + b"\r\n") + _get(b"/never"))
        head, _ = read_response(sock, bytearray())
        assert b"connection: close" in head
        assert _read_all(sock) == b""  # the request after it is not answered


def test_connection_close_from_the_app_closes(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(b"/close"))
        head, _ = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 204") and b"connection: close" in head
        assert closed(sock)


def test_pipelined_requests_get_their_answers_in_order(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_post(b"/", b"1") + _post(b"/", b"2") + _post(b"/", b"3"))
        buf = bytearray()
        assert [read_response(sock, buf)[1] for _ in range(3)] == [b"Body: 1", b"Body: 2", b"Body: 3"]


def test_a_request_split_anywhere_is_one_request(server: Server) -> None:  # uvicorn: test_fragmentation
    data = _post(b"/?param=" + b"q" * 10, b'{"a": 1}')
    with _connect(server) as sock:
        for i in range(0, len(data), 7):
            sock.sendall(data[i : i + 7])
            time.sleep(0.001)  # each piece its own segment, on purpose
        head, body = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 200") and body == b'Body: {"a": 1}'


# -- framing the answer (uvicorn: chunked, undersized, oversized) ---------------------------------------------


def test_no_length_is_chunked_with_one_last_chunk(server: Server) -> None:
    head, body = _exchange(server, _get(b"/chunked"))
    assert b"transfer-encoding: chunked" in head and head.count(b"transfer-encoding") == 1
    assert body == b"7\r\nHello, \r\n6\r\nworld!\r\n0\r\n\r\n"
    head, body = _exchange(server, _get(b"/empty-chunked"))
    assert body == b"0\r\n\r\n"


@pytest.mark.parametrize("path", [b"/undersized", b"/oversized"])
def test_an_answer_that_breaks_its_own_length_is_cut(server: Server, path: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(path) + _get(b"/next"))
        data = _read_all(sock)
    # Never a body that disagrees with its head, never the next answer: the connection is
    # cut (uvicorn writes the head first; ours is held until the body, so nothing goes out).
    assert data == b""


def test_a_message_after_the_end_closes(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(b"/after-end"))
        head, _ = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 200")
        assert closed(sock)


# -- an app that misbehaves (uvicorn: test_app_exception ... test_missing_start_message) --------------------


@pytest.mark.parametrize("path", [b"/raise", b"/nothing", b"/no-start"])
def test_an_app_that_fails_before_answering_gets_a_500_and_a_close(server: Server, path: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(path))
        head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 500") and body == b"Internal Server Error"
        assert head.count(b"\r\ndate: ") == 1
        assert closed(sock)


@pytest.mark.parametrize("path", [b"/raise-mid-body", b"/start-only", b"/two-starts", b"/splitting"])
def test_an_app_that_fails_after_starting_is_cut_never_a_500(server: Server, path: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(_get(path))
        data = _read_all(sock)
    assert b"500 Internal Server Error" not in data
    assert b"smuggled" not in data  # uvicorn: test_response_header_splitting
    assert not data.endswith(b"0\r\n\r\n")


# -- the client leaves; reading after the answer (uvicorn: test_early_disconnect, test_read_after_response) ----


def test_a_client_that_leaves_is_an_http_disconnect(server: Server, app: Scripted) -> None:
    with _connect(server) as sock:
        sock.sendall(_post(b"/disconnect", b"{}"))
        wait_until(lambda: len(app.messages) == 1, message="the body was received")
    wait_until(lambda: len(app.messages) == 2, message="the disconnect was received")
    assert app.messages == [
        {"type": "http.request", "body": b"{}", "more_body": False},
        {"type": "http.disconnect"},
    ]


def test_receive_after_the_answer_waits_for_the_disconnect(server: Server, app: Scripted) -> None:
    with _connect(server) as sock:
        sock.sendall(_post(b"/read-after", b"{}"))
        assert read_response(sock, bytearray())[1] == b"Body: {}"
    wait_until(lambda: app.messages == [{"type": "http.disconnect"}], message="the disconnect was received")


# -- 100-continue (uvicorn: test_100_continue_*) --------------------------------------------------------------


def test_100_continue_then_the_answer(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 18\r\n\r\n")
        buf = bytearray()
        head, _ = read_response(sock, buf)
        assert head == b"HTTP/1.1 100 Continue"
        sock.sendall(b'{"hello": "world"}')
        assert read_response(sock, buf)[1] == b'Body: {"hello": "world"}'


# -- Upgrade is never honoured (uvicorn: test_unsupported_ws_upgrade_request, test_http2_upgrade_request) -----


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c", b"not-websocket"])
def test_an_upgrade_request_is_answered_as_a_plain_request(server: Server, upgrade: bytes) -> None:
    extra = b"Connection: upgrade\r\nUpgrade: " + upgrade + b"\r\nSec-WebSocket-Version: 11\r\n"
    head, body = _exchange(server, _get(extra=extra))
    assert head.startswith(b"HTTP/1.1 200") and body == b"Body: "


# -- what is refused: 400 (uvicorn: test_invalid_http*, h11: test_io, test_headers) -----------------------------


BAD_REQUESTS = {
    "invalid method": b"G?T / HTTP/1.1\r\nHost: x\r\n\r\n",
    "space in the target": b"GET /?x=y z HTTP/1.1\r\nHost: x\r\n\r\n",
    "invalid version": b"GET / HTTP1.1\r\nHost: x\r\n\r\n",
    "garbage after the request line": b"HEAD /foo HTTP/1.1 xxxxxx\r\nHost: a\r\n\r\n",
    "NUL in a header value": b"HEAD /foo HTTP/1.1\r\nHost: foo\x00bar\r\n\r\n",
    "DEL in the target": b"HEAD /\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
    "8-bit byte in the target": b"HEAD /\xee HTTP/1.1\r\nHost: x\r\n\r\n",
    "space before the colon": b"HEAD /foo HTTP/1.1\r\nfoo  : line\r\n\r\n",
    "tab before the colon": b"HEAD /foo HTTP/1.1\r\nfoo\t: line\r\n\r\n",
    "empty header name": b"HEAD /foo HTTP/1.1\r\n: line\r\n\r\n",
    "fold before any header": b"HEAD /foo HTTP/1.1\r\n  folded: line\r\n\r\n",
    "obs-fold (h11 unfolds it)": b"HEAD /foo HTTP/1.1\r\nHost: x\r\nSome: multi-line\r\n header\r\n\r\n",
    "bare LF (h11 takes it)": b"GET / HTTP/1.1\nHost: x\n\n",
    "content-length not a number": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: asdf\r\n\r\n",
    "content-length 1x": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\nx",
    "two content-lengths": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
    "a content-length list": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1 , 1,2\r\n\r\nxx",
    "transfer-encoding gzip": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    "chunked then gzip": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    "chunked123": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked123\r\n\r\n",
    "chunked twice": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    "garbage in a chunk size": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\x00\r\nxxx",
    "a chunk size too long": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"9" * 100 + b"\r\n",
    "bad chunk end": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx__1a\r\n",
    "bad chunk end (CR)": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx\r_1a\r\n",
    "bad chunk end (LF)": b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxxx_\n1a\r\n",
    "CONNECT": b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n",
    "asterisk-form": b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_request_that_is_not_http_1_1_is_400_and_reaches_no_app(server: Server, app: Scripted, name: str) -> None:
    with _connect(server) as sock:
        sock.sendall(BAD_REQUESTS[name])
        data = _read_all(sock)  # answered, then closed
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") or (head.startswith(b"HTTP/1.1 413") and "size" in name), data
    assert b"connection: close" in head and head.count(b"\r\ndate: ") == 1 and b'"error"' in body
    assert app.scopes == []


@pytest.mark.parametrize("data", [b"\x00", b"\x20", b"\x16\x03\x01\x00\xa5"], ids=["NUL", "space", "TLS hello"])
def test_bytes_that_cannot_start_a_request_are_refused_at_once(server: Server, data: bytes) -> None:
    with _connect(server) as sock:  # h11: test_early_detection_of_invalid_request: before any line end
        sock.sendall(data)
        head, _ = read_response(sock, bytearray())
    assert head.startswith(b"HTTP/1.1 400")


def test_a_hundred_kilobytes_of_garbage_is_refused(server: Server) -> None:  # uvicorn: test_invalid_http
    with _connect(server) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(b"x" * 100_000)
        assert _read_all(sock).startswith(b"HTTP/1.1 400")


def test_chunk_extensions_and_either_case_of_hex_are_fine(server: Server, app: Scripted) -> None:
    body = b"5;hello=there\r\nxxxxx\r\naA\r\n" + b"y" * 0xAA + b'\r\n0;random="junk";some=more\r\n\r\n'
    head, reply = _exchange(server, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert head.startswith(b"HTTP/1.1 200") and reply == b"Body: xxxxx" + b"y" * 0xAA


STRICTER_THAN_H11 = {  # h11 takes these; llhttp (strict) refuses them, and so do we
    "whitespace in a chunk extension": b"5; hello=there\r\nxxxxx\r\n0\r\n\r\n",
    "whitespace after a chunk size": b"5   \t \r\n01234\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(STRICTER_THAN_H11))
def test_chunk_framings_h11_tolerates_are_400(server: Server, app: Scripted, name: str) -> None:
    head, _ = _exchange(
        server, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + STRICTER_THAN_H11[name]
    )
    assert head.startswith(b"HTTP/1.1 400") and app.scopes == []


def test_a_control_byte_in_a_cookie_is_400(server: Server, app: Scripted) -> None:
    # h11 lets some garbage through in cookies (its issue 57); llhttp refuses any control
    # byte in a header value, and an LLM API's clients send none.
    cookie = b"___utmvafIumyLc=kUd\x01UpAt; path=/; Max-Age=900"
    head, _ = _exchange(server, _get(extra=b"Cookie: " + cookie + b"\r\n"))
    assert head.startswith(b"HTTP/1.1 400") and app.scopes == []


# -- huge heads (uvicorn: test_huge_headers_*) -------------------------------------------------------------


def test_a_head_past_the_bound_is_431_in_one_piece_or_two(server: Server) -> None:
    first = b"GET / HTTP/1.1\r\nHost: example.org\r\nCookie: " + b"x" * 32 * 1024
    for pieces in ([first + b"\r\n\r\n"], [first, b"x" * 32 * 1024 + b"\r\n\r\n"]):
        with _connect(server) as sock:
            with contextlib.suppress(OSError):
                for piece in pieces:
                    sock.sendall(piece)
            head, body = read_response(sock, bytearray())
        assert head.startswith(b"HTTP/1.1 431") and b"max_header_bytes" in body


def _head_of(size: int, space: bytes) -> bytes:
    """A GET whose head counts ``size`` bytes against the bound: its target, and each field's
    name and value with 4 more (": " and CRLF), whether or not the field has the space."""
    fixed = len(b"/") + len(b"host") + len(b"example.org") + 4 + len(b"x-pad") + 4
    return b"GET / HTTP/1.1\r\nHost:%sexample.org\r\nX-Pad:%s%s\r\n\r\n" % (space, space, b"v" * (size - fixed))


@pytest.mark.parametrize("space", [b" ", b""])
@pytest.mark.parametrize("pieces", [1, 3, 7])
def test_a_head_at_the_bound_passes_and_one_byte_more_is_431(server: Server, space: bytes, pieces: int) -> None:
    # The bound is on the head's fields as counted (uvicorn's and h11's rule), however the
    # bytes arrive: whole, in pieces, or behind another request in the same write.
    limit = 16 * 1024
    for size, status in ((limit, b"HTTP/1.1 200"), (limit + 1, b"HTTP/1.1 431")):
        data = _head_of(size, space)
        with _connect(server) as sock:
            with contextlib.suppress(OSError):
                step = -(-len(data) // pieces)
                for at in range(0, len(data), step):
                    sock.sendall(data[at : at + step])
                    time.sleep(0.01)
            head, _ = read_response(sock, bytearray())
        assert head.startswith(status), (size, pieces, head[:40])
        with _connect(server) as sock:  # pipelined behind a small request, in one write
            sock.sendall(_get() + data)
            buf = bytearray()
            first, _ = read_response(sock, buf)
            second, _ = read_response(sock, buf)
        assert first.startswith(b"HTTP/1.1 200") and second.startswith(status), (size, second[:40])


# -- Date: one on every answer ------------------------------------------------------------------------------


def test_every_answer_has_one_date_and_the_apps_own_is_kept(server: Server) -> None:
    for request in (_get(), _get(b"/chunked"), _get(b"/close"), _get(b"/raise"), b"GET /\x7f HTTP/1.1\r\n\r\n"):
        head, _ = _exchange(server, request)
        assert head.count(b"\r\ndate: ") == 1, head
        assert head.split(b"\r\ndate: ")[1].split(b"\r\n")[0].endswith(b" GMT"), head
    head, _ = _exchange(server, _get(b"/dated"))
    assert head.count(b"\r\ndate: ") == 1 and b"date: Tue, 01 Dec 2026 10:00:00 GMT" in head


# -- backpressure: a client that does not read stops the app's sends ---------------------------------------


def test_a_client_that_does_not_read_pauses_the_apps_sends(server: Server, app: Scripted) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", server.port))  # type: ignore[attr-defined]
        sock.sendall(_get(b"/big"))
        conn = wait_until(lambda: next(iter(server.connections), None), message="the connection is in")
        wait_until(lambda: conn.write_paused, message="the transport asks to pause")
        held = app.progress
        assert held < 32 * 1024 * 1024  # the app waits in send(): it has not sent it all
        data = bytearray()
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(1 << 20)
    assert app.progress == 32 * 1024 * 1024 and len(data) > app.progress


# -- stopping (uvicorn: test_shutdown_during_request, test_shutdown_during_idle) -----------------------------


def _stop(server: Server, grace_s: float) -> threading.Thread:
    """``server.shutdown(grace_s)`` on its loop (the server has a request running), from a thread."""
    loop = next(iter(server.tasks)).get_loop()
    stop = server.shutdown(grace_s)
    thread = threading.Thread(target=lambda: asyncio.run_coroutine_threadsafe(stop, loop).result(30))
    thread.start()
    return thread


def test_stopping_lets_a_request_finish_with_a_close_and_closes_idle_connections(app: Scripted) -> None:
    with serving(app) as server:
        idle = _connect(server)
        with _connect(server) as sock:
            sock.sendall(_post(b"/slow", b"{}"))
            wait_until(lambda: len(server.tasks) == 1, message="the request is served")
            stopper = _stop(server, 10)
            assert closed(idle)  # idle: closed at once
            app.release.set()
            head, body = read_response(sock, bytearray())
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head and body == b"Body: "
        stopper.join(30)
        idle.close()


def test_stopping_ends_a_stream_past_the_grace_with_an_error_event(app: Scripted) -> None:
    with serving(app) as server, _connect(server) as sock:
        sock.sendall(_get(b"/events"))
        data = b""
        while b"data: one" not in data:
            data += sock.recv(65536)
        _stop(server, 0.1).join(30)
        data += _read_all(sock)
    assert data.endswith(b"0\r\n\r\n")
    assert b'data: {"error":{"message":"prefixpin is shutting down' in data


# -- the connection cap (uvicorn: test_max_concurrency answers 503 at once) ------------------------------------
# covered in test_connection.py: test_when_every_connection_is_busy_a_new_one_gets_503
