"""The upstream's answer to a wire API request, written to the client and read by
the exchange's reply machine.

Every body goes out through the one body writer, :func:`proxy.relay.relay`: a
stream as its pieces arrive, through the reply machine (:class:`proxy.through.Through`);
a JSON answer once read whole (bounded by ``limits.max_decoded_bytes``), as one
piece; an answer past a bound as the upstream sent it.  The writer awaits the
moment *before the last byte* (``Runner.before_last``: a shared store's record)
just before the client can have what it waits for; the handler runs the moment
*after the last byte* once the response is over.  Both first finish reading the
reply (:meth:`Answering.read`): the message the client received, which the next
turn replays.

The reply machine reads a whole answer before it goes out only when it may
change it (a fork's tool guard); otherwise once the client has it, off its wait.
A body compressed although identity was asked for is decoded in bounded slices
(:mod:`proxy.upstream.decode`); one prefixpin cannot decode goes out unread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import orjson
from starlette.types import Send

from canonicalize import Reply
from canonicalize.sse import dumps, read
from proxy import responses
from proxy.addons import Runner
from proxy.config import Limits
from proxy.errors import UpstreamEncoding, UpstreamError
from proxy.flow import Flow, Placement
from proxy.metrics import Metrics
from proxy.relay import AsSent, HeldHead, One, relay
from proxy.through import Through
from proxy.upstream import decode
from proxy.upstream.headers import has_header, raw_response_headers
from proxy.upstream.message import Body, Response
from proxy.upstream.reading import Decoded, Over, read_whole
from proxy.watch import ClientGone, ClientWatch

log = logging.getLogger("prefixpin")
_NO_LENGTH = frozenset({204, 304})
Headers = list[tuple[bytes, bytes]]


class Answering:
    """Writes and reads each wire API answer (module docstring)."""

    def __init__(self, metrics: Metrics, limits: Limits, runner: Runner) -> None:
        self.m = metrics
        self.limits = limits
        self.runner = runner

    async def write(self, send: Send, resp: Response, flow: Flow, watch: ClientWatch, sent: float) -> bytes:
        """``resp`` to the client (``sent``: when the request went upstream); returns the
        whole answer as sent (empty for a stream, or one relayed unread).  A whole answer
        is read, then sent in one piece, here (not in a coroutine of its own: each wait
        suspends and resumes every frame of the chain)."""
        status, answer = resp.status, flow.answer
        answer.status = status
        decoder = self._decoder(flow, resp)
        headers = raw_response_headers(resp.headers, drop=(b"content-encoding",) if decoder else ())
        ctype = _first(headers, b"content-type")
        before_end = functools.partial(self.before_last, flow) if self.runner.before_last_hooks else None
        if status < 400 and b"text/event-stream" in ctype:
            await self._stream(send, resp, flow, tag(headers, flow), sent, watch, decoder, before_end)
            return b""
        with watch:
            content = await read_whole(resp.body, decoder, self.limits.max_decoded_bytes)
        if isinstance(content, Over):
            self.m.fail_open.labels("decode").inc()
            log.warning("an answer on %s is over limits.max_decoded_bytes: relayed unread", flow.inbound.exchange.name)
            with watch:
                await self._as_sent(send, resp, flow, content.raw, before_end)
            return b""  # not read: nothing to judge a 404 by
        self.m.upstream_ttft.observe(time.perf_counter() - sent)
        if status >= 400:
            self.m.upstream_errors.labels(f"http_{status // 100}xx").inc()
            answer.unread()
        elif answer.reply is not None:
            if answer.reply.offered is not None:  # the guard may change what the client gets: read first
                content = self._complete(flow, answer.reply, content)
            else:
                answer.whole = content  # read once the client has it (or just before, for a record)
        if not (status < 200 or status in _NO_LENGTH):
            headers.append((b"content-length", b"%d" % len(content)))
        await send({"type": "http.response.start", "status": status, "headers": tag(headers, flow)})
        await relay(send, One(content), before_end=before_end)
        return content

    async def before_last(self, flow: Flow) -> None:
        """The moment before the client's last bytes: the reply read, then its hooks."""
        self.read(flow)
        await self.runner.before_last(flow)

    def read(self, flow: Flow) -> None:
        """The reply as the client received it (``Answer.message``), a whole answer read
        now if it was not yet; once only."""
        answer = flow.answer
        if answer.whole is not None:
            content, answer.whole = answer.whole, None
            if answer.reply is not None:
                self._complete(flow, answer.reply, content)
        elif answer.reply is not None and answer.status < 400 and answer.message is None:
            answer.message = answer.reply.message()

    def _decoder(self, flow: Flow, resp: Response) -> decode.Decoder | None:
        """A decoder for a body the upstream compressed although asked not to; one
        prefixpin cannot undo goes to the client as it came, unread."""
        try:
            return decode.decoder(resp.header(b"content-encoding"))
        except decode.Undecodable as exc:
            log.warning("passing an upstream response through unread: %s", exc)
            flow.answer.unread()
            return None

    async def _as_sent(
        self,
        send: Send,
        resp: Response,
        flow: Flow,
        raw: list[bytes],
        before_end: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Past a bound, before the client's response started: the answer as the upstream
        sent it (its content-encoding, its bytes: ``raw`` read so far, then the rest),
        unread (fail open)."""
        flow.answer.unread()
        headers = raw_response_headers(resp.headers)
        length = resp.header(b"content-length")
        if length is not None and not has_header(resp.headers, b"transfer-encoding"):
            headers.append((b"content-length", length))
        await send({"type": "http.response.start", "status": resp.status, "headers": tag(headers, flow)})
        if resp.status >= 400:
            self.m.upstream_errors.labels(f"http_{resp.status // 100}xx").inc()
        for part in raw:
            if part:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await relay(send, resp.body, before_end=before_end)

    def _complete(self, flow: Flow, reply: Reply, content: bytes) -> bytes:
        """``content`` through the reply machine: what the client gets (a guard may have
        removed calls); the message kept."""
        try:
            # A guard reads the body as the most lenient client does (NaN, bad UTF-8, ...).
            obj, strict = read(content) if reply.offered is not None else (orjson.loads(content), True)
        except ValueError:
            return content
        try:
            changed = reply.complete(obj)
            flow.answer.message = reply.message()
            return dumps(obj, strict) if changed else content
        except Exception:
            log.exception("response processing failed; passing the response through")
            self.m.fail_open.labels("response").inc()
            return content

    async def _stream(
        self,
        send: Send,
        resp: Response,
        flow: Flow,
        headers: Headers,
        sent: float,
        watch: ClientWatch,
        decoder: decode.Decoder | None,
        before_end: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Relay a streamed body as it arrives, through the exchange's reply machine.
        A client that leaves ends it (the upstream connection is closed); an upstream
        that cuts it gets an in-band error event and a clean end.  A compressed stream's
        head waits for its first event, so that a stream past a bound before then can
        still go out as the upstream sent it."""
        start = {"type": "http.response.start", "status": resp.status, "headers": headers}
        body: Body = resp.body
        held = None
        if decoder is None:
            await send(start)
            await send({"type": "http.response.body", "body": b"", "more_body": True})  # the head goes out now
        else:
            body = decoded = Decoded(resp.body, decoder, keep_raw=True)
            send = held = HeldHead(send, start, on_sent=decoded.forget_raw)
        limits = self.limits
        through = Through(
            self.m,
            flow,
            sent,
            max_event_bytes=limits.max_event_bytes,
            max_decoded_bytes=limits.max_decoded_bytes,
            held=held,
        )
        try:
            with watch:
                await relay(send, body, through, before_end=before_end)
        except ClientGone:
            pass  # counted with the upstream's status, as the relay saw it
        except AsSent:
            assert held is not None and isinstance(body, Decoded)
            with watch:
                await self._as_sent(held.send, resp, flow, body.raw, before_end)
        except UpstreamError as exc:
            if held is not None and not held.sent:
                raise  # nothing went out yet: a 502 in the API's shape
            kind = exc.metric_kind if isinstance(exc, UpstreamEncoding) else "stream_cut"
            self.m.upstream_errors.labels(kind).inc()
            log.warning("the upstream cut a stream on %s: %s", flow.inbound.exchange.name, exc.logged)
            flow.answer.status = 502
            await send({"type": "http.response.body", "body": responses.stream_cut(flow.inbound.exchange, exc)})


def _first(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes:
    """The first value of header ``name`` (lowercase), else empty (a loop: a generator
    left unfinished by ``next`` is closed by a raised ``GeneratorExit``)."""
    for k, v in headers:
        if k == name:
            return v
    return b""


def tag(headers: Headers, flow: Flow) -> Headers:
    """Our ``x-prefixpin-*`` response headers, each replacing one the upstream sent."""
    tags = [(b"x-prefixpin-role", flow.role.encode())]
    outcome = flow.outcome
    if outcome is not None:
        tags.append((b"x-prefixpin-lineage", outcome.record.id.encode()))
    # Always there, empty when no rule changed the request: a client can tell "nothing
    # changed" from "not through prefixpin".
    tags.append((b"x-prefixpin-rewrites", ",".join(flow.rewrites).encode()))
    if flow.answer.replica is not None:
        tags.append((b"x-prefixpin-replica", b"%d" % flow.answer.replica))
    placement = flow.get(Placement)
    if placement is not None and placement.slot is not None:
        tags.append((b"x-prefixpin-slot", b"%d" % placement.slot))
    for name, _ in headers:
        if name.startswith(b"x-prefixpin-"):  # (rare: an upstream that is a prefixpin too)
            names = {k for k, _ in tags}
            return [(k, v) for k, v in headers if k not in names] + tags
    return headers + tags


__all__ = ["Answering", "tag"]
