"""A client that leaves: proxy.watch in isolation, then the app served by prefixpin's
server in front of a raw-socket upstream (a real server: an in-process ASGI
transport cannot disconnect mid-body)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import from_mapping
from proxy.watch import WATCH, ClientGone, ClientWatch
from tests.infra import rawupstream as raw
from tests.infra.front import serving
from tests.infra.wait import wait_until


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError


def test_the_servers_callback_cancels_only_an_armed_wait() -> None:
    async def main() -> None:
        told: list[Any] = []
        watch = ClientWatch({"extensions": {WATCH: told.append}}, _never)
        assert len(told) == 1  # registered with the server, no task started
        with watch:
            await asyncio.sleep(0)  # nothing happened: the region runs through
        asyncio.get_running_loop().call_later(0.01, told[0])
        with pytest.raises(ClientGone), watch:
            await asyncio.sleep(30)  # the work the client's leaving interrupts
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cancellation was ours, and consumed
        await asyncio.sleep(0)  # a cancellation still pending would be thrown in here
        with pytest.raises(ClientGone), watch:  # gone: the region does not start
            raise AssertionError("not reached")
        watch.close()

    asyncio.run(main())


def test_the_task_the_server_names_is_the_one_cancelled() -> None:
    """prefixpin's server says which task serves the request (the extension returns it):
    that one is cancelled, whichever task made the watch."""

    async def main() -> None:
        told: list[Any] = []
        started = asyncio.Event()

        async def serving_task() -> None:
            started.set()
            await asyncio.sleep(30)

        serving = asyncio.get_running_loop().create_task(serving_task())
        await started.wait()

        def register(on_lost: Any) -> asyncio.Task[None]:
            told.append(on_lost)
            return serving

        watch = ClientWatch({"extensions": {WATCH: register}}, _never)
        watch.armed = True  # as inside ``with watch:`` in the serving task
        told[0]()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert serving.cancelled()

    asyncio.run(main())


def test_a_client_gone_while_unarmed_cancels_nothing() -> None:
    async def main() -> None:
        told: list[Any] = []
        watch = ClientWatch({"extensions": {WATCH: told.append}}, _never)
        told[0]()
        # Not cancelled: no region was armed.  The watch cancels at once (Task.cancel), and
        # a cancelled task gets it at its next await: this one.
        await asyncio.sleep(0)
        assert watch.gone
        with pytest.raises(ClientGone), watch:
            pass

    asyncio.run(main())


def test_a_wait_that_turns_the_cancellation_into_another_error_is_still_client_gone() -> None:
    async def wait() -> None:
        try:
            await asyncio.sleep(30)  # the work the client's leaving interrupts
        except asyncio.CancelledError:
            raise OSError("a library's own idea of being interrupted") from None

    async def main() -> None:
        told: list[Any] = []
        watch = ClientWatch({"extensions": {WATCH: told.append}}, _never)
        asyncio.get_running_loop().call_later(0.01, told[0])
        with pytest.raises(ClientGone), watch:
            await wait()
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # and nothing is pending for the task: it would be thrown in here

    asyncio.run(main())


def test_a_cancellation_that_is_not_the_clients_passes_through() -> None:
    armed = asyncio.Event()

    async def main() -> None:
        watch = ClientWatch({"extensions": {WATCH: lambda cb: None}}, _never)
        with watch:
            armed.set()
            await asyncio.sleep(30)  # the work someone else cancels

    async def outer() -> None:
        task = asyncio.ensure_future(main())
        await armed.wait()  # the task waits inside the armed region
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(outer())


def test_without_the_servers_extension_receive_is_watched() -> None:
    async def main() -> None:
        left = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await left.wait()
            return {"type": "http.disconnect"}

        watch = ClientWatch({}, receive)
        asyncio.get_running_loop().call_later(0.01, left.set)
        with pytest.raises(ClientGone), watch:
            await asyncio.sleep(30)  # the work the client's leaving interrupts
        watch.close()

    asyncio.run(main())


# -- served -----------------------------------------------------------------------------------------

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: keep-alive\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


class SlowUpstream:
    """Streams an event every 50 ms for 10 s, or answers JSON after 10 s (``"slow"`` in
    the body); notes when prefixpin closes the connection while it is still answering."""

    def __init__(self) -> None:
        self.closed_early = threading.Event()
        self.up = raw.RawUpstream(self.script)

    def script(self, conn: raw.Conn) -> None:
        while (req := conn.read_request()) is not None:
            slow = b'"slow"' in req.body
            stream = b'"stream":true' in req.body.replace(b" ", b"")
            if not slow:
                conn.send(raw.json_response())
                continue
            if stream:
                conn.send(SSE_HEAD)
            conn.sock.settimeout(0.05)
            for _ in range(200):
                try:
                    if conn.sock.recv(1) == b"":
                        self.closed_early.set()
                        return
                except TimeoutError:
                    pass
                if stream:
                    conn.send(raw.chunk(EVENT))
            conn.sock.settimeout(None)
            conn.send(raw.chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n" if stream else raw.json_response())


@contextlib.contextmanager
def served(upstream: str, **sections: dict[str, Any]) -> Iterator[str]:
    """The app on prefixpin's server, in a thread; one upstream connection at most."""
    config = from_mapping({"upstream": {"url": upstream, "max_connections": 1, "timeout_s": 5}, **sections})
    with serving(create_app(config)) as server:
        yield f"http://127.0.0.1:{server.port}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"], ids=["exchange", "passthrough"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_a_client_that_leaves_releases_the_upstream_connection(stream: bool, path: str) -> None:
    """The upstream's connection is closed as soon as the client leaves, mid-stream or
    while waiting, and its place is free: with ``max_connections: 1`` the next request
    gets through (it would wait for the pool until the 5 s timeout otherwise)."""
    slow = SlowUpstream()
    try:
        with served(slow.up.url) as base:
            body = b'{"model":"m","user":"slow","stream":%s,"messages":[{"role":"user","content":"hi"}]}' % (
                b"true" if stream else b"false"
            )
            port = int(base.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(
                    b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
                )
                if stream:
                    seen = b""
                    while EVENT not in seen:  # the stream is flowing
                        chunk = s.recv(65536)
                        assert chunk, "prefixpin closed the connection"  # else this loop would spin
                        seen += chunk
                    assert seen.count(b"content-type: text/event-stream") == 1
                else:  # until the upstream has the request and is "generating"
                    wait_until(lambda: slow.up.requests, timeout=5, message="the upstream has the request")
            assert slow.closed_early.wait(5), "the upstream connection must be closed when the client leaves"
            with httpx.Client(trust_env=False, timeout=30) as http:
                r = http.post(base + path, json={"model": "m", "messages": []})
                assert r.status_code == 200
                metrics = http.get(base + "/metrics").text
            if not stream and path == "/v1/chat/completions":
                assert 'prefixpin_requests_total{role="root",route="chat_completions",status="499"} 1.0' in metrics
    finally:
        slow.up.close()
