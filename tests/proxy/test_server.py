"""prefixpin's uvicorn protocol: the cork that sends a whole response in one write,
on its own and served for real."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import uvicorn

from proxy.server import CORK, DeadlineProtocol, protocol
from tests.infra.procs import free_port


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


def _proto() -> tuple[Any, _Transport]:
    t = _Transport()
    return SimpleNamespace(cycle=SimpleNamespace(transport=t)), t


def test_corked_writes_go_out_in_one_write_when_uncorked() -> None:
    proto, t = _proto()
    DeadlineProtocol._cork(proto, True)
    DeadlineProtocol._cork(proto, True)  # twice: still one hold
    proto.cycle.transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    proto.cycle.transport.write(b"body")
    assert t.writes == []
    assert proto.cycle.transport.get_extra_info("peername") == "info:peername"  # the rest passes through
    DeadlineProtocol._cork(proto, False)
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert proto.cycle.transport is t
    DeadlineProtocol._cork(proto, False)  # not corked: nothing happens
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]


def test_a_close_while_corked_sends_what_was_held_first() -> None:
    proto, t = _proto()
    DeadlineProtocol._cork(proto, True)
    proto.cycle.transport.write(b"last")
    proto.cycle.transport.close()
    assert t.writes == [b"last"] and t.closing


def test_what_was_held_for_a_connection_already_closing_is_dropped() -> None:
    proto, t = _proto()
    DeadlineProtocol._cork(proto, True)
    proto.cycle.transport.write(b"late")
    t.closing = True  # aborted meanwhile
    DeadlineProtocol._cork(proto, False)
    assert t.writes == []


def test_no_cycle_no_cork() -> None:
    DeadlineProtocol._cork(SimpleNamespace(cycle=None), True)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b"x" * 1000
    cork = scope["extensions"][CORK]
    cork(True)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
    await send({"type": "http.response.body", "body": body})
    cork(False)


def test_a_corked_response_served_for_real_keeps_the_connection_alive() -> None:
    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=protocol(5.0), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            for _ in range(3):  # three requests on one connection
                sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                data = b""
                while not data.endswith(b"x" * 1000):
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed the connection"
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and body == b"x" * 1000
    finally:
        server.should_exit = True
        thread.join(10)


def test_body_in_says_whether_the_current_requests_body_has_arrived() -> None:
    assert not DeadlineProtocol._body_in(SimpleNamespace(cycle=None))
    assert not DeadlineProtocol._body_in(SimpleNamespace(cycle=SimpleNamespace(more_body=True)))
    assert DeadlineProtocol._body_in(SimpleNamespace(cycle=SimpleNamespace(more_body=False)))
