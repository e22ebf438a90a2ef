"""An ASGI app served for real by prefixpin's own server (proxy.front), in a thread,
on a free port of 127.0.0.1: for tests that need a socket (streaming, a client that
leaves, framing) without a whole ``prefixpin serve`` process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from proxy.front import Limits, Server, listen, serve
from tests.infra.procs import free_port


@contextlib.contextmanager
def serving(app: Any, *, limits: Limits | None = None, max_connections: int = 1000) -> Iterator[Server]:
    """``app`` served until the block ends; the server's ``port`` is set."""
    port = free_port()
    server = Server(app, limits=limits or Limits(), max_connections=max_connections)
    server.port = port  # type: ignore[attr-defined]
    sock = listen("127.0.0.1", port)
    ready = threading.Event()
    failed: list[BaseException] = []
    held: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            held["stop"] = asyncio.Event()
            held["loop"] = asyncio.get_running_loop()
            await serve(server, [sock], grace_s=2.0, on_ready=ready.set, stop=held["stop"])

        try:
            asyncio.run(main())
        except BaseException as exc:  # the test sees it below
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "the server did not start"
    if failed:
        raise failed[0]
    try:
        yield server
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(10)


def read_response(sock: socket.socket, buf: bytearray) -> tuple[bytes, bytes]:
    """One response (content-length, chunked, or none for 1xx) off ``sock``; ``buf``
    keeps what follows it.  The chunked body is returned with its framing."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    del buf[:]
    buf += rest
    lines = head.lower().split(b"\r\n")
    if head.startswith(b"HTTP/1.1 1") or head.startswith(b"HTTP/1.1 204") or head.startswith(b"HTTP/1.1 304"):
        return head, b""
    length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:")), None)
    if length is None and b"transfer-encoding: chunked" not in lines:  # until the close
        while chunk := sock.recv(65536):
            buf += chunk
        body = bytes(buf)
        del buf[:]
        return head, body
    if length is None:
        while bytes(buf).find(b"0\r\n\r\n") < 0:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection mid-body"
            buf += chunk
        end = bytes(buf).index(b"0\r\n\r\n") + 5
    else:
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection mid-body"
            buf += chunk
        end = length
    body, rest = bytes(buf[:end]), bytes(buf[end:])
    del buf[:]
    buf += rest
    return head, body


def buffered_responses(sock: socket.socket) -> int:
    """How many whole responses wait in ``sock``'s receive buffer, read by nobody: a
    peek (MSG_PEEK), so a test can wait until a server has written its answers to a
    client that reads nothing yet.  A response whose body ends at the close never
    counts: it is not whole while the connection is open."""
    try:
        data = sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    count = 0
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head, rest = data[:end], data[end + 4 :]
        lines = head.lower().split(b"\r\n")
        if head.startswith((b"HTTP/1.1 1", b"HTTP/1.1 204", b"HTTP/1.1 304")):
            size = 0
        elif b"transfer-encoding: chunked" in lines:
            last = rest.find(b"0\r\n\r\n")  # the framing read_response goes by
            if last < 0:
                break
            size = last + 5
        else:
            length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length:")), None)
            if length is None or len(rest) < length:
                break
            size = length
        count, data = count + 1, rest[size:]
    return count


def closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Does the server close ``sock`` (EOF or reset) within ``timeout``, reading whatever it sends first?"""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True
