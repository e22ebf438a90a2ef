"""The upstream the clients are measured against (``python -m benchmarks.http.upstream
--port N``): answers prepared once, written in one call, so that the client's cost is
what is measured.

    POST /json     a 45 KB body read, a chat completion answered (the overhead benchmark's)
    POST /stream   a 1,000-event chat stream, one chunk per event
    GET /bomb      256 MiB of zeros, gzip (255 KiB on the wire)
    GET /head      a 1 MiB response head
    GET /big       64 MiB, chunked, written as fast as the client takes it
    absolute-form  (as an egress proxy sees it) the target and Host it got, as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import zlib

import httptools
import uvloop

from benchmarks.overhead.nginx import reply

MiB = 1 << 20


def _head(*headers: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _bomb() -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    return b"".join(z.compress(zeros) for _ in range(256)) + z.flush()


def answers() -> dict[str, bytes]:
    body = reply().encode()
    event = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token"}}]}\n\n'
    bomb = _bomb()
    return {
        "/json": _head(b"content-type: application/json", b"content-length: %d" % len(body)) + body,
        "/stream": _head(b"content-type: text/event-stream", b"transfer-encoding: chunked")
        + _chunk(event) * 1000
        + _chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n",
        "/bomb": _head(b"content-type: application/json", b"content-encoding: gzip", b"content-length: %d" % len(bomb))
        + bomb,
        "/head": _head(b"x-big: " + b"a" * MiB, b"content-length: 2") + b"{}",
    }


class Upstream(asyncio.Protocol):
    def __init__(self, prepared: dict[str, bytes]) -> None:
        self.prepared = prepared
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.host = b""
        self.drained: asyncio.Event = asyncio.Event()
        self.drained.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"host":
            self.host = value

    def on_message_complete(self) -> None:
        url, self.url = self.url.decode("latin-1"), b""
        assert self.transport is not None
        if not url.startswith("/"):  # an egress proxy's view of the request
            body = json.dumps({"target": url, "host": self.host.decode("latin-1")}).encode()
            self.transport.write(_head(b"content-length: %d" % len(body)) + body)
        elif url == "/big":
            asyncio.get_running_loop().create_task(self._big())
        else:
            self.transport.write(self.prepared.get(url.partition("?")[0], self.prepared["/json"]))

    async def _big(self) -> None:
        t = self.transport
        assert t is not None
        t.write(_head(b"content-type: text/plain", b"transfer-encoding: chunked"))
        piece = _chunk(b"x" * (256 * 1024))
        for _ in range(256):
            await self.drained.wait()
            if t.is_closing():
                return
            t.write(piece)
        t.write(b"0\r\n\r\n")


async def serve(port: int) -> None:
    prepared = answers()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Upstream(prepared), "127.0.0.1", port, backlog=1024)
    print(f"listening on {port}", flush=True)
    await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    uvloop.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
