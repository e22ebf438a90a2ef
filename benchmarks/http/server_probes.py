"""How each server meets a hostile client, serving ``apps.probe``: one short verdict per
behaviour, the first word ``ok`` where the server holds (the report's table).

trailers     a chunked body's trailer field: kept out of the headers the app sees?
head         a request head that never ends: refused after how much?
cl+te        content-length and transfer-encoding together: kept from the app?
connect      ``CONNECT host:port``: kept from the app?
date         ``date`` on the answer, once?
slow reader  64 MiB to a client that reads nothing: how much does the server hold?
fd limit     300 idle connections under a 256-file limit: is /healthz still answered?
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable

from benchmarks.http.servers import Running

MiB = 1 << 20


def _exchange(r: Running, data: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", r.port), timeout=timeout) as s:
        with contextlib.suppress(OSError):
            s.sendall(data)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and _whole(out):
                    break
    return out


def _whole(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return body.endswith(b"0\r\n\r\n")


def _status(data: bytes) -> int:
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _reached_app(data: bytes) -> bool:
    return _status(data) == 200 and b'"headers"' in data


def trailers(r: Running) -> str:
    req = (
        b"POST /headers HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n"
        b"trailer: x-injected\r\n\r\n2\r\n{}\r\n0\r\nx-injected: 1\r\n\r\n"
    )
    out = _exchange(r, req)
    if not _reached_app(out):
        return f"refused ({_status(out)})"
    seen = {k.lower() for k, _ in json.loads(out.partition(b"\r\n\r\n")[2])["headers"]}
    return "merged into the headers" if "x-injected" in seen else "ok: dropped"


def head(r: Running) -> str:
    sent = 0
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"GET /headers HTTP/1.1\r\nhost: x\r\nx-flood: ")
        try:
            while sent < 96 * MiB:
                s.sendall(b"a" * 65536)
                sent += 65536
            s.sendall(b"\r\n\r\n")
            answer = s.recv(65536)
        except OSError:  # the server stopped reading and closed: what it answered, if anything
            with contextlib.suppress(OSError):
                answer = s.recv(65536)
                return f"ok: refused ({_status(answer) or 'closed'})"
            return "ok: refused (closed)"
    status = _status(answer)
    if status >= 400:
        return f"ok: refused ({status})"
    return f"took {sent // MiB} MiB ({status or 'no answer'})"


def cl_te(r: Running) -> str:
    req = (
        b"POST /headers HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 5\r\n"
        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    out = _exchange(r, req)
    return "reached the app" if _reached_app(out) else f"ok: {_status(out) or 'closed'}"


def connect(r: Running) -> str:
    out = _exchange(r, b"CONNECT example.org:443 HTTP/1.1\r\nhost: example.org:443\r\n\r\n")
    status = _status(out)  # a 2xx answer to CONNECT carries no body (RFC 9110 9.3.6): the app's, then
    return "reached the app" if 200 <= status < 300 else f"ok: {status or 'closed'}"


def date(r: Running) -> str:
    out = _exchange(r, b"GET /headers HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    n = out.partition(b"\r\n\r\n")[0].lower().count(b"\r\ndate: ")
    return "ok: once" if n == 1 else f"{n} times"


def slow_reader(r: Running) -> str:
    before = r.rss()
    peak = before
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        s.connect(("127.0.0.1", r.port))
        s.sendall(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        stable, last = 0, -1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and stable < 10:  # until its memory stops growing
            time.sleep(0.1)
            rss = r.rss()
            peak = max(peak, rss)
            stable = stable + 1 if abs(rss - last) < MiB // 4 else 0
            last = rss
    held = (peak - before) / MiB
    return f"ok: held {held:.0f} MiB" if held < 16 else f"held {held:.0f} MiB"


def fd_limit(r: Running) -> str:
    idle = []
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(("127.0.0.1", r.port), timeout=2))
        out = _exchange(r, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", timeout=5)
    finally:
        for s in idle:
            s.close()
    return f"ok: {_status(out)}" if 0 < _status(out) < 500 else f"not answered ({_status(out) or 'nothing'})"


PROBES: dict[str, Callable[[Running], str]] = {
    "trailers": trailers,
    "head": head,
    "cl+te": cl_te,
    "connect": connect,
    "date": date,
    "slow reader": slow_reader,
}
FD_LIMIT = 256  # fd limit: run on a server started with this open-file limit

__all__ = ["FD_LIMIT", "PROBES", "fd_limit"]
