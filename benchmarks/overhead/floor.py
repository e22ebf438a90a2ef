"""``python-floor``: what Python itself costs to forward the same requests.

A bare HTTP/1.1 proxy on the event loop and parser prefixpin's shell uses (uvloop,
httptools), written for this benchmark only: each client connection gets its own
keep-alive connection to the upstream; a request's head is parsed, its body
forwarded behind a new head (``host``, ``content-length`` and the client's other
headers), and the upstream's answer, framed by its ``content-length``, written back
as it came.  Nothing else: no timeouts, no limits, no chunked bodies, no pipelining,
no pooling, no headers filtered, no error answered (a connection that fails is
closed).  It is no proxy anyone should run; it is the floor a Python HTTP shell
stands on, next to which prefixpin's own shell (``prefixpin-bypass``) is measured.

    python3 -m benchmarks.overhead.floor --upstream 127.0.0.1:8080 --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httptools
import uvloop

from benchmarks.overhead.targets import Target
from tests.infra.procs import REPO, Proc, free_port

_DROPPED = frozenset({b"host", b"connection", b"content-length", b"transfer-encoding", b"keep-alive"})


class _Upstream(asyncio.Protocol):
    """One client connection's connection to the upstream: answers written back as they come."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.end = -1  # where the answer being read ends in ``buffer`` (-1: its head is not in)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.end < 0:
                head_end = self.buffer.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                self.end = head_end + 4 + _content_length(bytes(self.buffer[:head_end]))
            if len(self.buffer) < self.end:
                return
            answer = bytes(self.buffer[: self.end])
            del self.buffer[: self.end]
            self.end = -1
            self.client.write(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """One client connection: each request forwarded once its body is in."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.up: _Upstream | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.waiting: list[bytes] = []  # requests framed before the upstream connection is up
        self.url = b""
        self.headers: list[bytes] = []
        self.parts: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _DROPPED:
            self.headers.append(name + b": " + value + b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.parts)
        method = self.parser.get_method()
        head = b"%s %s HTTP/1.1\r\nhost: upstream\r\ncontent-length: %d\r\n%s\r\n" % (
            method,
            self.url,
            len(body),
            b"".join(self.headers),
        )
        self.url, self.headers, self.parts = b"", [], []
        up = self.up
        if up is not None and up.transport is not None:
            up.transport.writelines((head, body))
            return
        self.waiting += (head, body)
        if self.connecting is None:
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, self.up = await loop.create_connection(lambda: _Upstream(self), *self.upstream)
        except OSError:
            self.close()
            return
        assert self.up.transport is not None
        self.up.transport.writelines(self.waiting)
        self.waiting = []

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def serve(upstream: tuple[str, int], port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def target(upstream_base: str) -> Target:
    """``python-floor`` in front of ``upstream_base`` (``http://HOST:PORT``)."""

    def launch(log_dir: Path) -> tuple[list[Proc], str]:
        port = free_port()
        host_port = upstream_base.rsplit("/", 1)[-1]
        argv = [sys.executable, "-m", "benchmarks.overhead.floor", "--upstream", host_port, "--port", str(port)]
        proc = Proc("python-floor", argv, log_dir, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        proc.wait_http(base + "/health", timeout=20)  # (the upstream's, through it)
        return [proc], base

    return Target("python-floor", launch)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead.floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the upstream")
    ap.add_argument("--port", type=int, required=True, help="the port to listen on (127.0.0.1)")
    args = ap.parse_args()
    host, _, port = args.upstream.rpartition(":")
    uvloop.run(serve((host, int(port)), args.port))


if __name__ == "__main__":
    main()


__all__ = ["serve", "target"]
