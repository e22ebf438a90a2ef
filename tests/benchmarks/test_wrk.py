"""wrk sends, request by request, exactly the bodies ``workloads.render`` says
(``wrk.lua`` and ``render`` are one function written twice), and its figures parse."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

from benchmarks.overhead import workloads, wrk

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _serve(sock: socket.socket, bodies: list[bytes], stop: threading.Event) -> None:
    """Answer 200 to each request, keeping the bodies.  wrk first opens and closes a
    connection to probe the address, then opens its one connection (-c1)."""
    # wrk resets its connections when it stops, and the socket closes under accept(): both end it.
    sock.settimeout(0.1)  # to see ``stop`` between connections
    with contextlib.suppress(OSError):
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            _connection(conn, bodies, stop)


def _connection(conn: socket.socket, bodies: list[bytes], stop: threading.Event) -> None:
    buf = b""
    with conn:
        while not stop.is_set():
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next(int(ln.split(b":")[1]) for ln in lines if ln.lower().startswith(b"content-length"))
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1")
            while len(buf) < length:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                buf += chunk
            bodies.append(buf[:length])
            buf = buf[length:]
            conn.sendall(OK)


@pytest.mark.parametrize("placeholders", ["@@SEQ@@ at @@MM@@", "pass @@GEN@@ — ünïcode", "none @@ here"])
def test_wrk_sends_the_rendered_bodies_in_order(tmp_path: Path, placeholders: str) -> None:
    templates = [f'{{"n":"{placeholders}","t":{i}}}' for i in range(3)]
    path = tmp_path / "bodies.jsonl"
    path.write_text("\n".join(templates) + "\n", encoding="utf-8")
    bodies: list[bytes] = []
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as sock:
        server = threading.Thread(target=_serve, args=(sock, bodies, stop), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions"
        load = wrk.run(url, path, conns=1, duration_s=1, start=995)
        stop.set()
        server.join(5)
    assert load.requests >= 20 and load.error_count == 0
    # wrk renders one request before its connection is up and never sends it: 996 comes first.
    first = next(n for n in (995, 996) if bodies[0].decode() == workloads.render(templates, n))
    for i, got in enumerate(bodies[:50]):
        assert got.decode() == workloads.render(templates, first + i)


def test_parse_reads_done_output() -> None:
    load = wrk.parse(
        '{"requests":300,"duration_us":2000000,"connect":0,"read":1,"write":0,"status":2,"timeout":0,'
        '"p50_us":250,"p90_us":400,"p99_us":900,"mean_us":300.5,"max_us":5000}'
    )
    assert load.rps == 150 and load.errors == {"read": 1, "status": 2} and load.error_count == 3
    assert (load.p50_ms, load.p99_ms) == (0.25, 0.9)
