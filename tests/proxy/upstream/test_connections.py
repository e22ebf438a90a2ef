"""The upstream transport and client against a raw-socket upstream (no prefixpin process)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from proxy.config import Upstream
from proxy.errors import (
    PathRefused,
    UpstreamItself,
    UpstreamProtocol,
    UpstreamReset,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.upstream import connections
from proxy.upstream.adapter import translate
from proxy.upstream.client import UpstreamClient
from proxy.upstream.connections import Connections
from proxy.upstream.message import Request, Response, Timeouts
from proxy.upstream.target import Base, climbs
from tests.infra import rawupstream as raw
from tests.infra import tcp
from tests.infra.wait import wait_until, wait_until_async

T = TypeVar("T")


def _request(url: str, method: str = "POST", content: bytes = b"{}") -> Request:
    base = Base.parse(url)
    return Request(method, base.origin_parts, base.target("/v1/x"), [], content, Timeouts(5, 5, 5))


def _client(url: str) -> UpstreamClient:
    return UpstreamClient(Upstream(url=url), Connections(max_connections=4))


async def _read(r: Response) -> bytes:
    return await r.read()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_pooled_connection_the_upstream_closed_is_not_used(loop: str) -> None:
    """The race behind llama-server's "keep-alive, then close": the FIN is in the
    kernel but the event loop has not seen it yet when the next request takes the
    pooled connection.  The transport looks at the socket first."""
    closed = threading.Event()

    def script(conn: raw.Conn) -> None:
        if conn.read_request() is not None:
            conn.send(raw.json_response(keep_alive=True))
            conn.sock.close()
            closed.set()

    up = raw.RawUpstream(script)

    async def main() -> list[int]:
        transport = Connections(max_connections=4)
        statuses = []
        try:
            for _ in range(3):
                r = await transport.send(_request(up.url))
                await r.read()
                statuses.append(r.status)
                assert closed.wait(5)
                closed.clear()
                # Blocking, so the loop does not run and cannot see the FIN: until the FIN is
                # in this side's kernel (the connection in CLOSE_WAIT).
                wait_until(lambda: tcp.fin_received(up.port), timeout=5, interval=0.001, message="the FIN arrived")
        finally:
            await transport.aclose()
        return statuses

    try:
        factory = asyncio.new_event_loop if loop == "asyncio" else pytest.importorskip("uvloop").new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            assert runner.run(main()) == [200, 200, 200]
        assert len(up.requests) == 3
    finally:
        up.close()


def test_a_request_reset_after_it_was_sent_is_not_resent() -> None:
    up = raw.RawUpstream(raw.reset_after_read)

    async def main() -> None:
        client = _client(up.url)
        try:
            with pytest.raises(UpstreamReset) as info:
                await client.send("PUT", "/v1/x", "", [], b"{}")  # a general client would resend a PUT
            assert not info.value.never_sent
            # A resend would have gone out, on a new connection, before the error came
            # back; the marker's connection is accepted after it.  Once the upstream has
            # read the marker, it has counted every connection a resend could have used.
            with pytest.raises(UpstreamReset):
                await client.send("PUT", "/v1/x", "", [], b'"marker"')
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
        assert up.connections == 2 and [r.body for r in up.requests] == [b"{}", b'"marker"']
    finally:
        up.close()


@pytest.mark.parametrize(
    ("path", "escapes"),
    [
        ("/v1/models", False),
        ("/v1/a/../models", False),
        ("/v1/..", False),
        ("/..", True),
        ("/a/../..", True),
        ("/%2E%2e/x", True),
        ("/a%2f..%2f..", True),
        ("/a\\..\\..", True),
        ("/%252e%252e/x", True),
        ("/a//../..", True),
        ("/./a/./..", False),
    ],
)
def test_climbs(path: str, escapes: bool) -> None:
    assert climbs(path) is escapes


def test_target_joins_base_path_and_query() -> None:
    base = Base.parse("http://u:p@h:1/tenantA/v1?api_key=k")
    assert base.origin == "http://h:1" and base.userinfo == ("u", "p")
    assert base.target("/v1/chat/completions", "x=1") == "/tenantA/v1/chat/completions?api_key=k&x=1"
    assert base.target("/v1/a/%2e/b") == "/tenantA/v1/a/%2e/b?api_key=k"
    with pytest.raises(PathRefused):
        base.target("/v1/../../admin")
    with pytest.raises(PathRefused):
        base.target("/v1/../v1/models")  # climbs above the base on the way, even if it comes back


def test_timeouts_say_which_phase_and_no_url_secrets() -> None:
    url = "http://alice:pw-SECRET@h:1/v1?api_key=qs-SECRET"
    c = translate(httpx.ConnectTimeout("timed out connecting to the upstream"), url)
    r = translate(httpx.ReadTimeout("timed out waiting for the upstream"), url)
    assert (c.status, r.status) == (504, 504)
    assert "connecting" in str(c) and "waiting for the upstream's response" in str(r)
    for e in (c, r):
        assert "SECRET" not in str(e) + e.detail and "h:1" not in str(e)


def test_a_refused_connection_is_a_connect_error_that_names_no_secret() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        client = _client(f"http://alice:pw-SECRET@127.0.0.1:{port}/v1?api_key=qs-SECRET")
        try:
            with pytest.raises(UpstreamUnavailable) as info:
                await client.send("POST", "/v1/x", "", [], b"{}")
        finally:
            await client.aclose()
        assert info.value.never_sent and info.value.status == 502
        assert "SECRET" not in str(info.value) + info.value.detail

    asyncio.run(main())


def test_a_body_without_length_ends_with_the_connection_and_head_has_no_body() -> None:
    def script(conn: raw.Conn) -> None:
        req = conn.read_request()
        if req is None:
            return
        if req.line.startswith(b"HEAD"):
            conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
        else:
            conn.send(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello ")
            conn.send(b"world")
        conn.sock.close()

    up = raw.RawUpstream(script)

    async def main() -> tuple[bytes, bytes]:
        transport = Connections(max_connections=4)
        try:
            body = await (await transport.send(_request(up.url, "GET", b""))).read()
            head = await (await transport.send(_request(up.url, "HEAD", b""))).read()
            return body, head
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(main()) == (b"hello world", b"")
    finally:
        up.close()


def test_access_log_query_redaction() -> None:
    from proxy.redact import redact, redact_query

    assert redact_query("/v1/x?key=a&api-key=b&Access_Token=c&token=d&limit=5&x") == (
        "/v1/x?key=***&api-key=***&Access_Token=***&token=***&limit=5&x"
    )
    assert redact_query("/v1/x") == "/v1/x"
    assert redact("https://u:p@[::1]:8443/v1?api_key=k#f") == "https://[::1]:8443/v1"


def test_an_idle_connection_is_not_reused_near_the_upstreams_keep_alive_timeout() -> None:
    """llama-server says ``Keep-Alive: timeout=5`` and closes idle connections then;
    a request sent on one just as it closes would be a 502.  Past the advertised
    timeout less a second, a new connection is made."""

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nkeep-alive: timeout=1\r\n"
                b"content-length: 2\r\n\r\n{}"
            )

    up = raw.RawUpstream(script)

    async def main() -> None:
        transport = Connections(max_connections=4)
        try:
            for _ in range(2):
                r = await transport.send(_request(up.url))
                assert await r.read() == b"{}"
            (pool,) = transport._pools.values()
            (conn,) = pool.idle
            assert conn.idle_limit == 0.0  # timeout=1, less a second: never reused after idling
        finally:
            await transport.aclose()

    try:
        asyncio.run(main())
    finally:
        up.close()


# -- a response is complete at its framing ---------------------------------------------------------


def _serve_then(extra: bytes) -> raw.RawUpstream:
    """Answers each request with ``{}`` followed, in the same write, by ``extra``."""

    def script(conn: raw.Conn) -> None:
        while conn.read_request() is not None:
            conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}" + extra)

    return raw.RawUpstream(script)


@pytest.mark.parametrize(
    "extra",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nextra",  # a second whole response
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\npart",  # a partial one
        b"garbage",  # bytes that are no response at all
    ],
    ids=["second-response", "partial-response", "garbage"],
)
def test_bytes_after_a_complete_response_are_not_the_clients_and_the_connection_is_not_reused(extra: bytes) -> None:
    """The client gets exactly the framed body; the connection is never returned to the
    pool, so the next request (another tenant's, say) goes on a new one and is answered."""
    up = _serve_then(extra)

    async def main() -> None:
        transport = Connections(max_connections=4)
        try:
            for _ in range(3):
                r = await transport.send(_request(up.url))
                assert await r.read() == b"{}"
                # The extra bytes came with the answer: the connection is dropped, at once or
                # when the loop sees them on the idle connection.
                await wait_until_async(
                    lambda: all(c.closed for p in transport._pools.values() for c in p.idle),
                    timeout=5,
                    interval=0.005,
                    message="no idle connection left open",
                )
            assert all(not p.idle for p in transport._pools.values()) or all(
                c.closed for p in transport._pools.values() for c in p.idle
            )
        finally:
            await transport.aclose()

    try:
        asyncio.run(main())
        assert len(up.requests) == 3  # each answered: none lost on a connection mid-message
        assert up.connections == 3
    finally:
        up.close()


@pytest.mark.parametrize("status", [600, 999, 99])
def test_a_status_http_does_not_have_is_a_protocol_error(status: int) -> None:
    def script(conn: raw.Conn) -> None:
        if conn.read_request() is not None:
            conn.send(b"HTTP/1.1 %03d Weird\r\ncontent-length: 2\r\n\r\n{}" % status)

    up = raw.RawUpstream(script)

    async def main() -> None:
        client = _client(up.url)
        try:
            with pytest.raises(UpstreamProtocol, match=f"status {status}"):
                await client.send("POST", "/v1/x", "", [], b"{}")
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        up.close()


def test_a_read_timeout_is_a_504() -> None:
    def script(conn: raw.Conn) -> None:
        if conn.read_request() is not None:
            conn.hang(2)  # a slow upstream: no answer for 2 s, the client waits 0.3 s

    up = raw.RawUpstream(script)

    async def main() -> None:
        client = UpstreamClient(Upstream(url=up.url, timeout_s=0.3), Connections(max_connections=4))
        try:
            with pytest.raises(UpstreamTimeout) as info:
                await client.send("POST", "/v1/x", "", [], b"{}")
            assert info.value.status == 504 and not info.value.never_sent
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        up.close()


def _closes_soon_after_a_stream(conn: raw.Conn) -> None:
    """llama-server's way: keep-alive after JSON; after a stream, close a moment later
    (a request written meanwhile is never read)."""
    while (req := conn.read_request()) is not None:
        if b'"stream":true' not in req.body:
            conn.send(raw.json_response())
            continue
        conn.send(raw.sse_response(raw.STREAM_EVENTS))
        time.sleep(0.05)
        return


def _run(main: Callable[[Connections], Awaitable[T]]) -> T:
    async def go() -> T:
        transport = Connections(max_connections=4)
        try:
            return await main(transport)
        finally:
            await transport.aclose()

    return asyncio.run(go())


def _closing_after_the_first_stream(
    caplog: pytest.LogCaptureFixture, seen: Callable[[raw.RawUpstream], Awaitable[object]]
) -> None:
    """Three streams, then two JSON answers, against llama-server's way; ``seen`` waits
    after the first stream until its close is where the test wants it.  The pool learns
    that the origin closes after a stream (it says so once), and no request meets a
    closing connection; after JSON the connection is reused."""
    up = raw.RawUpstream(_closes_soon_after_a_stream)
    stream = b'{"stream":true}'

    async def main(transport: Connections) -> list[int]:
        statuses = []
        for n, body in enumerate([stream, stream, stream, b"{}", b"{}"]):
            r = await transport.send(_request(up.url, content=body))
            await r.read()
            statuses.append(r.status)
            if n == 0:
                await seen(up)
        return statuses

    try:
        with caplog.at_level(logging.INFO, logger="prefixpin"):
            assert _run(main) == [200] * 5
        assert len(up.requests) == 5
        assert up.connections == 4  # one per stream, then one for both JSON answers
        assert "closes its connections after a streamed response" in caplog.text
    finally:
        up.close()


def test_an_upstream_seen_closing_after_a_stream_gets_no_stream_connection_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found at the pool: the FIN is in this side's kernel, the event loop has not run."""

    async def fin_in_the_kernel(up: raw.RawUpstream) -> None:
        # Blocking, so the loop does not run and cannot see the FIN.
        wait_until(lambda: tcp.fin_received(up.port), timeout=5, interval=0.001, message="the FIN arrived")

    _closing_after_the_first_stream(caplog, fin_in_the_kernel)


def test_an_upstream_closing_after_a_stream_is_learned_when_the_loop_saw_the_close_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a slow host the event loop handles the upstream's close before the next request
    comes (the pooled connection is closed, not merely readable): learned all the same."""

    def loop_saw_it(up: raw.RawUpstream) -> bool:  # this side closed too: nothing ESTABLISHED or in CLOSE_WAIT
        return all(s.state not in ("ESTABLISHED", "CLOSE_WAIT") for s in tcp.sockets() if s.remote_port == up.port)

    async def closed_by_the_loop(up: raw.RawUpstream) -> None:
        await wait_until_async(lambda: loop_saw_it(up), timeout=5, interval=0.001, message="the loop closed its side")

    _closing_after_the_first_stream(caplog, closed_by_the_loop)


def _streams(transport: Connections, url: str, n: int, pause: float = 0.0) -> Awaitable[list[int | str]]:
    """``n`` streamed requests, one after another (``pause`` seconds after each); a
    request that meets a closing connection is ``"reset"`` (never resent)."""

    async def go() -> list[int | str]:
        out: list[int | str] = []
        for _ in range(n):
            try:
                r = await transport.send(_request(url, content=b'{"stream":true}'))
                await r.read()
                out.append(r.status)
            except UpstreamReset:
                out.append("reset")
            await asyncio.sleep(pause)
        return out

    return go()


def test_a_streams_connection_waits_until_the_origin_is_known_to_keep_it() -> None:
    """llama-server's close a few ms after a stream never meets a request, not even the
    first time: a stream's connection carries nothing in its first second while the
    origin's way is unknown."""
    up = raw.RawUpstream(_closes_soon_after_a_stream)
    try:
        assert _run(lambda t: _streams(t, up.url, 4)) == [200] * 4
        assert len(up.requests) == 4 and up.connections == 4
    finally:
        up.close()


def test_an_origin_seen_keeping_a_streams_connection_gets_them_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "CLOSED_SOON_S", 0.05)
    up = raw.RawUpstream(raw.answer_keeping_streams)

    async def main(transport: Connections) -> list[int | str]:
        first = await _streams(transport, up.url, 1, pause=0.1)  # kept open past CLOSED_SOON_S: learned
        return first + await _streams(transport, up.url, 3)

    try:
        assert _run(main) == [200] * 4
        assert len(up.requests) == 4 and up.connections == 1
    finally:
        up.close()


def test_a_streams_waiting_connection_gives_its_slot_up_at_the_cap() -> None:
    """The connection waiting out its first second holds one of ``max_connections``:
    at the cap the next request closes it and opens its own, at once (it does not wait
    for the pool's timeout, which would fail the request)."""
    up = raw.RawUpstream(raw.answer_keeping_streams)

    async def main() -> list[int | str]:
        transport = Connections(max_connections=1)
        try:
            return await _streams(transport, up.url, 3)
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(main()) == [200] * 3
        assert len(up.requests) == 3 and up.connections == 3
    finally:
        up.close()


def test_a_reused_connection_closed_under_a_request_after_a_stream_is_learned(monkeypatch: pytest.MonkeyPatch) -> None:
    """An origin that kept a stream's connection once, then closes one a moment after
    its stream: the request written into the closing connection fails (never resent);
    from then on a stream's connection is not pooled."""
    monkeypatch.setattr(connections, "CLOSED_SOON_S", 0.05)
    served = itertools.count()

    def script(conn: raw.Conn) -> None:  # the first stream kept; after that, llama-server's way
        while conn.read_request() is not None:
            conn.send(raw.sse_response(raw.STREAM_EVENTS))
            if next(served) >= 1:
                time.sleep(0.05)
                return

    up = raw.RawUpstream(script)

    async def main(transport: Connections) -> list[int | str]:
        first = await _streams(transport, up.url, 1, pause=0.1)  # learned: the origin keeps them
        return first + await _streams(transport, up.url, 4)

    try:
        assert _run(main) == [200, 200, "reset", 200, 200]
        assert len(up.requests) == 4  # the one written into the closing connection was never read
        assert up.connections == 3
    finally:
        up.close()


@pytest.mark.parametrize(
    ("peer", "local", "listening", "itself"),
    [
        (("127.0.0.1", 8787), ("127.0.0.1", 50000), [("127.0.0.1", 8787)], True),
        (("127.0.0.1", 8080), ("127.0.0.1", 50000), [("127.0.0.1", 8787)], False),  # another port: the model server
        (("127.0.0.2", 8787), ("127.0.0.1", 50000), [("127.0.0.1", 8787)], False),  # another address, not listened on
        (("10.1.2.3", 8787), ("10.1.2.3", 50000), [("0.0.0.0", 8787)], True),  # a local address, every one listened on
        (("10.1.2.3", 8787), ("10.1.2.9", 50000), [("0.0.0.0", 8787)], False),  # another machine
        (("127.0.0.1", 8787), ("127.0.0.1", 50000), [("::", 8787)], False),  # an IPv6 listener takes no IPv4
        (("::1", 8787, 0, 0), ("::1", 50000, 0, 0), [("::", 8787)], True),
        (("::1", 8787, 0, 0), ("::1", 50000, 0, 0), [("::1", 8787)], True),
        (("::1", 8787, 0, 0), ("::1", 50000, 0, 0), [("0.0.0.0", 8787)], False),
        (None, ("127.0.0.1", 50000), [("127.0.0.1", 8787)], False),  # (a transport that says nothing)
    ],
)
def test_reaches_itself_by_the_listening_addresses(peer: object, local: object, listening: list, itself: bool) -> None:
    assert connections.reaches_itself(peer, local, listening) is itself


def test_a_connection_to_its_own_listening_address_carries_no_request() -> None:
    """A name that resolves to the listening address (``127.1`` here): refused once
    connected, before a byte is written, with a message that names the fix; another
    port of the same host (the model server) is sent to as ever."""
    got: list[bytes] = []

    def script(conn: raw.Conn) -> None:
        if conn.read_request() is not None:
            conn.send(raw.json_response(keep_alive=False))

    model = raw.RawUpstream(script)

    async def main() -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                got.append(await reader.read())  # until the far end closes
            except ConnectionError:
                got.append(b"")
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = Connections(max_connections=4, listening=[("127.0.0.1", port)])
        try:
            with pytest.raises(UpstreamItself) as refused:
                await transport.send(_request(f"http://127.1:{port}"))
            said = str(refused.value)
            assert "prefixpin itself" in said and "point the upstream URL at the model server" in said, said
            assert refused.value.never_sent
            await wait_until_async(lambda: bool(got), timeout=5, message="the accepted side saw the close")
            r = await transport.send(_request(f"http://127.1:{model.port}"))
            await r.read()
            return r.status
        finally:
            await transport.aclose()
            server.close()
            model.close()

    assert asyncio.run(main()) == 200
    assert got == [b""]  # nothing was written to it
