"""prefixpin's upstream client held to a library's standard: the cases of httpcore's
HTTP/1.1 and pool tests (tests/_async/test_http11.py, test_connection_pool.py) and of
aiohttp's response parser tests (tests/test_http_parser.py) that apply to a client,
written afresh against ``proxy.upstream.connections`` and a raw-socket upstream.

Where we answer differently, on purpose, the test says so: a response that is not
strict HTTP/1.1 (obs-fold, bare LF, a control byte in a value, a chunk size with
whitespace) is a protocol error, as in aiohttp's strict (dev) mode and not its lax
one; a 101 is an error (we never switch protocols); a head is bounded
(``limits.max_header_bytes``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from proxy.errors import RequestRejected, UpstreamProtocol, UpstreamReset, UpstreamTimeout
from proxy.upstream.connections import Connections
from proxy.upstream.message import Request, Response, Timeouts
from proxy.upstream.target import Base
from tests.infra import rawupstream as raw
from tests.infra.wait import wait_until_async

T = TypeVar("T")
Script = Callable[[raw.Conn], None]
HELLO = b"HTTP/1.1 200 OK\r\nContent-Type: plain/text\r\nContent-Length: 13\r\n\r\nHello, world!"


def answer(*responses: bytes, close: bool = False) -> Script:
    """Each request gets the next of ``responses`` (the last one again once they run out)."""
    answers = list(responses)

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(answers.pop(0) if len(answers) > 1 else answers[0])
            if close:
                return

    return script


def request(up: raw.RawUpstream, method: str = "GET", headers: list[tuple[str, str]] | None = None) -> Request:
    base = Base.parse(up.url)
    return Request(method, base.origin_parts, "/", headers or [], b"", Timeouts(5, 5, 5))


def run(script: Script, main: Callable[[Connections, raw.RawUpstream], Coroutine[Any, Any, T]], **kw: Any) -> T:
    up = raw.RawUpstream(script)

    async def go() -> T:
        transport = Connections(max_connections=kw.pop("max_connections", 4), **kw)
        try:
            return await main(transport, up)
        finally:
            await transport.aclose()

    try:
        return asyncio.run(go())
    finally:
        up.close()


async def fetch(transport: Connections, up: raw.RawUpstream, **kw: Any) -> tuple[Response, bytes]:
    r = await transport.send(request(up, **kw))
    return r, await r.read()


# -- httpcore: test_http11.py -------------------------------------------------------------------------------


def test_a_response_is_read_and_its_connection_reused() -> None:  # test_http11_connection
    async def main(t: Connections, up: raw.RawUpstream) -> list[bytes]:
        return [(await fetch(t, up))[1] for _ in range(3)]

    up_ref: list[raw.RawUpstream] = []

    async def counted(t: Connections, up: raw.RawUpstream) -> list[bytes]:
        up_ref.append(up)
        return await main(t, up)

    assert run(answer(HELLO), counted) == [b"Hello, world!"] * 3
    assert up_ref[0].connections == 1


def test_a_response_closed_before_its_end_closes_its_connection() -> None:  # ..._unread_response
    released = threading.Event()
    accepted: list[raw.Conn] = []

    def script(conn: raw.Conn) -> None:
        accepted.append(conn)
        while conn.read_request() is not None:
            if len(accepted) == 1:  # the first connection: the head and part of the body, then nothing
                conn.send(HELLO[:-5])
                released.wait(10)
                return
            conn.send(HELLO)

    async def main(t: Connections, up: raw.RawUpstream) -> int:
        r = await t.send(request(up))
        await r.aclose()  # released before its end: the connection is in the middle of a message
        released.set()
        await fetch(t, up)
        return up.connections

    assert run(script, main) == 2


def test_a_response_whole_in_the_buffer_is_reused_even_unread() -> None:
    # Where httpcore closes: every byte of it arrived (one write, with its head), so the
    # connection is between messages.
    async def main(t: Connections, up: raw.RawUpstream) -> int:
        r = await t.send(request(up))
        await r.aclose()
        await fetch(t, up)
        return up.connections

    assert run(answer(HELLO), main) == 1


@pytest.mark.parametrize(
    "garbage",
    [b"Wait, this isn't valid HTTP!", b"HTT/1\r\n\r\n", b"HT/11 200 Ok\r\n\r\n", b"HTTP/12.3 200 Ok\r\n\r\n"],
)
def test_bytes_that_are_not_a_response_are_a_protocol_error(garbage: bytes) -> None:
    # test_http11_connection_with_remote_protocol_error; aiohttp: test_http_response_parser_bad*
    async def main(t: Connections, up: raw.RawUpstream) -> int:
        with pytest.raises(UpstreamProtocol):
            await fetch(t, up)
        await fetch(t, up)  # a new connection: the broken one is not reused
        return up.connections

    assert run(answer(garbage, HELLO), main) == 2


def test_a_response_cut_short_is_an_error_never_a_shorter_body() -> None:  # ..._with_incomplete_response
    cut = b"HTTP/1.1 200 OK\r\nContent-Type: plain/text\r\nContent-Length: 13\r\n\r\nHello, wor"

    async def main(t: Connections, up: raw.RawUpstream) -> None:
        with pytest.raises(UpstreamReset, match="before the response body was complete"):
            await fetch(t, up)

    run(answer(cut, close=True), main)


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-test", "\0"), ("x-test", "a\r\nx-smuggled: 1"), ("x-test", "a\nb"), ("x-a\r\nx-smuggled", "1")],
)
def test_a_header_that_would_break_the_request_is_refused_before_sending(name: str, value: str) -> None:
    # test_http11_connection_with_local_protocol_error
    async def main(t: Connections, up: raw.RawUpstream) -> int:
        with pytest.raises(RequestRejected):
            await t.send(request(up, headers=[("x-ok", "1"), (name, value)]))
        return len(up.requests)

    assert run(answer(HELLO), main) == 0


@pytest.mark.parametrize(
    "interim",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"],
)
def test_interim_responses_are_skipped(interim: bytes) -> None:  # test_http11_expect_continue, _early_hints
    async def main(t: Connections, up: raw.RawUpstream) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        r, body = await fetch(t, up)
        return r.status, body, r.headers

    status, body, headers = run(answer(interim + HELLO), main)
    assert (status, body) == (200, b"Hello, world!") and (b"Link", b"</style.css>; rel=preload") not in headers


def test_switching_protocols_is_an_error() -> None:  # test_http11_upgrade_connection: we never upgrade
    switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: custom\r\n\r\n..."

    async def main(t: Connections, up: raw.RawUpstream) -> None:
        with pytest.raises(UpstreamProtocol, match="switched protocols"):
            await fetch(t, up)

    run(answer(switch), main)


@pytest.mark.parametrize(("bound", "ok"), [(128 * 1024, True), (64 * 1024, False)])
def test_a_head_of_100_kib_passes_within_the_bound_only(bound: int, ok: bool) -> None:  # ..._header_sub_100kb
    big = b"HTTP/1.1 200 OK\r\nCookie: " + b"x" * (100 * 1024 - 72) + b"\r\nContent-Length: 0\r\n\r\n"
    assert _passes_within(big, bound) is ok


def _passes_within(head: bytes, bound: int) -> bool:
    """Does an answer of ``head`` pass ``max_header_bytes=bound`` (else the error names it)?"""

    async def main(t: Connections, up: raw.RawUpstream) -> bool:
        try:
            return (await fetch(t, up))[0].status == 200
        except UpstreamProtocol as exc:
            assert "max_header_bytes" in str(exc)
            return False

    return run(answer(head), main, max_header_bytes=bound)


@pytest.mark.parametrize("space", [b" ", b""])
@pytest.mark.parametrize(("over", "ok"), [(0, True), (1, False)])
def test_a_head_at_the_bound_passes_and_one_byte_more_does_not(space: bytes, over: int, ok: bool) -> None:
    # Counted as its fields (name, value and 4 more each for ": " and CRLF) and its reason,
    # with or without the space after each colon.
    bound = 16 * 1024
    fixed = len(b"OK") + len(b"x-pad") + 4 + len(b"content-length") + len(b"0") + 4
    pad = b"v" * (bound + over - fixed)
    head = b"HTTP/1.1 200 OK\r\nX-Pad:%s%s\r\nContent-Length:%s0\r\n\r\n" % (space, pad, space)
    assert _passes_within(head, bound) is ok


def test_the_host_header_carries_an_idna_host() -> None:
    async def main(t: Connections, up: raw.RawUpstream) -> tuple[str | None, int]:
        origin = Base.parse(f"http://bücher.example:{up.port}").origin_parts
        assert origin.host == "xn--bcher-kva.example"
        # Connect to loopback, as that name would resolve: the Host header is what is checked.
        r = await t.send(Request("GET", type(origin)("http", "127.0.0.1", up.port, origin.netloc), "/", [], b""))
        await r.read()
        return up.requests[0].header("host"), up.port

    host, port = run(answer(HELLO), main)
    assert host == f"xn--bcher-kva.example:{port}"


# -- httpcore: test_connection_pool.py --------------------------------------------------------------------


def test_a_response_that_says_close_is_not_reused() -> None:  # test_connection_pool_with_close
    closing = HELLO.replace(b"Content-Length", b"Connection: close\r\nContent-Length")

    async def main(t: Connections, up: raw.RawUpstream) -> int:
        for _ in range(2):
            await fetch(t, up)
        return up.connections

    assert run(answer(closing), main) == 2


def test_many_requests_share_a_few_connections() -> None:  # test_connection_pool_concurrency
    async def main(t: Connections, up: raw.RawUpstream) -> list[bytes]:
        return [b for _, b in await asyncio.gather(*(fetch(t, up) for _ in range(10)))]

    counts: list[int] = []

    async def counted(t: Connections, up: raw.RawUpstream) -> list[bytes]:
        out = await main(t, up)
        counts.append(up.connections)
        return out

    assert run(answer(HELLO), counted, max_connections=2) == [b"Hello, world!"] * 10
    assert counts == [2]


def test_waiting_for_a_connection_times_out() -> None:  # test_connection_pool_timeout
    held = threading.Event()

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            held.wait(10)
            conn.send(HELLO)

    async def main(t: Connections, up: raw.RawUpstream) -> None:
        first = asyncio.ensure_future(fetch(t, up))
        await wait_until_async(lambda: len(up.requests) == 1, message="the first request holds the connection")
        base = Base.parse(up.url)
        with pytest.raises(UpstreamTimeout, match="free connection"):
            await t.send(Request("GET", base.origin_parts, "/", [], b"", Timeouts(5, 5, 0.05)))
        held.set()
        await first

    run(script, main, max_connections=1)


def test_a_connection_past_its_keep_alive_is_not_reused() -> None:  # ..._with_immediate_expiry
    async def main(t: Connections, up: raw.RawUpstream) -> int:
        for _ in range(2):
            await fetch(t, up)
        return up.connections

    assert run(answer(HELLO), main, keepalive_s=0.0) == 2


def test_the_upstreams_own_keep_alive_timeout_is_honoured() -> None:
    short = HELLO.replace(b"Content-Length", b"Keep-Alive: timeout=1\r\nContent-Length")

    async def main(t: Connections, up: raw.RawUpstream) -> int:
        for _ in range(2):
            await fetch(t, up)
        return up.connections

    assert run(answer(short), main) == 2  # stop reusing 1 s before its close: at once here


# -- aiohttp: test_http_parser.py (the response parser) ---------------------------------------------------


def _one(response: bytes, method: str = "GET") -> tuple[Response, bytes]:
    async def main(t: Connections, up: raw.RawUpstream) -> tuple[Response, bytes]:
        return await fetch(t, up, method=method)

    return run(answer(response, close=True), main)


def test_no_reason_phrase() -> None:
    r, _ = _one(b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n")
    assert r.status == 200 and r.reason == b""


def test_a_utf8_header_value_is_kept_as_bytes() -> None:
    r, _ = _one("HTTP/1.1 200 OK\r\nX-Test: тест\r\nContent-Length: 0\r\n\r\n".encode())
    assert r.header(b"x-test") == "тест".encode()


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 99 test\r\n\r\n",
        b"HTTP/1.1 9999 test\r\n\r\n",
        b"HTTP/1.1 ttt test\r\n\r\n",
        b"HTTP/1.1 20\xd9\xa0 test\r\n\r\n",  # a non-ASCII digit
        b"HTTP/1.1 200 OK\r\nFoo: abc\x00def\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        # aiohttp's lax mode takes these; its strict mode, and we, do not:
        b"HTTP/1.1 200 Ok\r\ntest: line\r\n continue\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\nFoo: abc\nContent-Length: 4\n\nBODY",
        b"HTTP/1.1 200 test\r\nFoo: abc\x01def\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nabcde\r\n0\r\n\r\n",
    ],
    ids=[
        "status-99",
        "status-9999",
        "status-ttt",
        "status-non-ascii",
        "nul-in-value",
        "two-lengths",
        "length-and-chunked",
        "obs-fold",
        "bare-lf",
        "control-byte",
        "chunk-size-space",
    ],
)
def test_a_response_that_is_not_strict_http_1_1_is_a_protocol_error(response: bytes) -> None:
    async def main(t: Connections, up: raw.RawUpstream) -> None:
        with pytest.raises(UpstreamProtocol):
            await fetch(t, up)

    run(answer(response), main)


def test_chunked_only_when_it_is_the_last_coding() -> None:
    # test_http_response_parser_last_chunked / _notchunked / _empty_list_te_not_chunked (RFC 9112 6.3)
    _, body = _one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: not, chunked\r\n\r\n1\r\nT\r\n3\r\nest\r\n0\r\n\r\n")
    assert body == b"Test"
    raw_body = b"1\r\nT\r\n3\r\nest\r\n0\r\n\r\n"
    _, body = _one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: notchunked\r\n\r\n" + raw_body)
    assert body == raw_body  # read to the close, as sent
    _, body = _one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ,  \t ,\r\n\r\nbody")
    assert body == b"body"


def test_a_body_without_length_is_read_to_the_close() -> None:
    _, body = _one(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
    assert body == b"until the end"


@pytest.mark.parametrize(("status", "method"), [(204, "GET"), (304, "GET"), (200, "HEAD")])
def test_no_body_where_http_has_none(status: int, method: str) -> None:  # h11: test__body_framing
    async def main(t: Connections, up: raw.RawUpstream) -> tuple[int, bytes]:
        r, body = await fetch(t, up, method=method)
        return r.status, body

    head = b"HTTP/1.1 %d X\r\nContent-Length: 5\r\n\r\n" % status  # the length a GET would have had
    assert run(answer(head), main) == (status, b"")
