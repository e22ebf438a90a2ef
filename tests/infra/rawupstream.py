"""A raw-socket upstream for fault tests, scripted per test.

``RawUpstream(script)`` listens on loopback and runs ``script(conn)`` in a
thread for each accepted connection; the script decides what the upstream
does: answer, read the whole request and then reset the connection, hang after
accept, send headers and hang, cut a chunked body mid-way, close after a stream
while advertising keep-alive...  Every request read is recorded raw (request
line, headers in order, body), so tests see exactly what prefixpin sent.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

JSON_REPLY = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'  # noqa: E501


@dataclass
class RawRequest:
    line: bytes  # b"POST /v1/chat/completions HTTP/1.1"
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def target(self) -> str:
        return self.line.split(b" ")[1].decode("latin-1")


class Conn:
    """One accepted connection, as a script sees it."""

    def __init__(self, sock: socket.socket, upstream: RawUpstream) -> None:
        self.sock = sock
        self.upstream = upstream
        self._buf = b""

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except OSError:
            return b""

    def read_request(self) -> RawRequest | None:
        """Read one whole request (headers, then a Content-Length or chunked body) and
        record it; None when the peer closed first."""
        while b"\r\n\r\n" not in self._buf:
            data = self._recv()
            if not data:
                return None
            self._buf += data
        head, _, self._buf = self._buf.partition(b"\r\n\r\n")
        line, *lines = head.split(b"\r\n")
        headers = [
            (k.decode("latin-1").strip(), v.decode("latin-1").strip())
            for k, _, v in (ln.partition(b":") for ln in lines)
        ]
        req = RawRequest(line, headers, b"")
        if (req.header("transfer-encoding") or "").lower() == "chunked":
            body = self._read_chunked()
            if body is None:
                return None
            req.body = body
        else:
            length = int(req.header("content-length") or 0)
            while len(self._buf) < length:
                data = self._recv()
                if not data:
                    return None
                self._buf += data
            req.body, self._buf = self._buf[:length], self._buf[length:]
        with self.upstream.lock:
            self.upstream.requests.append(req)
        return req

    def _read_chunked(self) -> bytes | None:
        """The chunked body, or None when the peer closed mid-body."""
        body = b""
        while True:
            while b"\r\n" not in self._buf:
                if not (data := self._recv()):
                    return None
                self._buf += data
            size_line, _, self._buf = self._buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(self._buf) < size + 2:
                if not (data := self._recv()):
                    return None
                self._buf += data
            body += self._buf[:size]
            self._buf = self._buf[size + 2 :]
            if size == 0:
                return body

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def hang(self, seconds: float = 60) -> None:
        self.upstream.stopped.wait(seconds)


class RawUpstream:
    """``tls``: a server context: it speaks HTTPS (``url`` then names ``localhost``)."""

    def __init__(self, script: Callable[[Conn], None], *, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.requests: list[RawRequest] = []
        self.connections = 0  # accepted so far
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"https://localhost:{self.port}" if tls else f"http://127.0.0.1:{self.port}"
        self.handshake_errors: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock: socket.socket) -> None:
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.handshake_errors.append(str(exc))
                sock.close()
                return
        conn = Conn(sock, self)
        try:
            self.script(conn)
        except OSError:
            pass
        finally:
            if sock.fileno() >= 0:
                sock.close()

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


# -- answers and scripts --------------------------------------------------------------


def json_response(body: bytes = JSON_REPLY, *, extra: bytes = b"", keep_alive: bool = True) -> bytes:
    conn = b"keep-alive" if keep_alive else b"close"
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: "
        + conn
        + b"\r\n"
        + extra
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse_response(events: list[bytes]) -> bytes:
    """A complete chunked SSE response that advertises keep-alive."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: keep-alive\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    return head + b"".join(chunk(b"data: " + e + b"\n\n") for e in events) + b"0\r\n\r\n"


STREAM_EVENTS = [
    b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"}}]}',
    b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b"[DONE]",
]


def answer_json(conn: Conn) -> None:
    """A well-behaved keep-alive upstream: every request gets a JSON 200."""
    while conn.read_request() is not None:
        conn.send(json_response())


def answer_keeping_streams(conn: Conn) -> None:
    """A well-behaved keep-alive upstream that streams: every request gets a stream, and
    the connection stays open for the next (vLLM's way)."""
    while conn.read_request() is not None:
        conn.send(sse_response(STREAM_EVENTS))


def reset_after_read(conn: Conn) -> None:
    """Reads the whole request, then resets the connection: it may be generating."""
    if conn.read_request() is not None:
        conn.reset()


def hang_after_accept(conn: Conn) -> None:
    conn.hang()


def headers_then_hang(conn: Conn) -> None:
    if conn.read_request() is not None:
        conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
        conn.hang()


def cut_chunked(conn: Conn) -> None:
    """Sends headers and one chunk of a chunked body, then closes (no last chunk)."""
    if conn.read_request() is not None:
        conn.send(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"partial ")
        )


def stream_then_close(conn: Conn) -> None:
    """Like llama-server: answers (a stream, or JSON) advertising keep-alive, then closes."""
    req = conn.read_request()
    if req is None:
        return
    conn.send(sse_response(STREAM_EVENTS) if b'"stream":true' in req.body.replace(b" ", b"") else json_response())
