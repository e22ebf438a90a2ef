"""A streamed answer's pieces through the exchange's reply machine, bounded.

:class:`Through` is the :class:`proxy.relay.Pieces` of a wire API's stream: the
bytes are split into SSE events (:class:`canonicalize.SSESplitter`), each fed
to the reply machine, which may drop or change it.  Two ways it stops reading
and lets the rest of the stream pass as it comes (fail open):

- the reply machine fails (``prefixpin_fail_open_total{stage="response"}``);
- a bound is passed (``stage="decode"``): an event still open past
  ``limits.max_event_bytes`` (an unterminated line holds no more than that), or
  more than ``limits.max_decoded_bytes`` of the stream read (decoded, when it is
  compressed): what the reply machine keeps of a stream (the reply's text, the
  events a guard holds) grows with it.  If nothing of the answer went out yet (a
  compressed stream's head is held until its first event), it raises
  :class:`proxy.relay.AsSent`: the answer is relayed as the upstream sent it,
  coding and all.
"""

from __future__ import annotations

import logging
import time

from canonicalize import SSESplitter
from proxy.flow import Flow
from proxy.metrics import Metrics
from proxy.relay import AsSent, HeldHead

log = logging.getLogger("prefixpin")


class Through:
    """See the module docstring.  ``held``: the held head of a compressed stream (None:
    the head went out already)."""

    def __init__(
        self,
        metrics: Metrics,
        flow: Flow,
        sent: float,
        *,
        max_event_bytes: int,
        max_decoded_bytes: int,
        held: HeldHead | None = None,
    ) -> None:
        self.metrics = metrics
        self.flow = flow
        self.sent = sent
        self.splitter = SSESplitter()
        self.first = True
        self.max_event_bytes = max_event_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self.read = 0  # bytes of the stream fed to the reply machine
        self.held = held

    def feed(self, chunk: bytes) -> bytes:
        reply = self.flow.answer.reply
        if reply is None:
            return chunk
        self.read += len(chunk)
        if self.read > self.max_decoded_bytes:
            return self._unbounded(b"", chunk, f"over {self.max_decoded_bytes} bytes read")
        splitter = self.splitter
        try:
            out = [b for b in (reply.feed(ev) for ev in splitter.feed(chunk)) if b is not None]
        except Exception:
            log.exception("stream processing failed; passing the rest through")
            self.metrics.fail_open.labels("response").inc()
            self.flow.answer.unread()
            return splitter.take() + chunk
        if self.first and reply.first_token:
            self.metrics.upstream_ttft.observe(time.perf_counter() - self.sent)
            self.first = False
        if splitter.held > self.max_event_bytes:
            return self._unbounded(b"".join(out), b"", f"an event over {self.max_event_bytes} bytes")
        return b"".join(out)

    def _unbounded(self, out: bytes, chunk: bytes, why: str) -> bytes:
        """Past a bound: the machine's held events, then the rest as it comes."""
        flow, reply = self.flow, self.flow.answer.reply
        assert reply is not None
        flow.answer.unread()
        self.metrics.fail_open.labels("decode").inc()
        log.warning("a %s stream passed a bound (%s): relaying the rest unread", flow.inbound.exchange.name, why)
        if self.held is not None and not self.held.sent:
            raise AsSent
        try:
            out += reply.close(b"")  # the events it held for a verdict, decided now
        except Exception:
            log.exception("stream processing failed; passing the rest through")
        return out + self.splitter.take() + chunk

    @property
    def last(self) -> bool:
        """The stream's last event went by (the reply machine saw it)."""
        reply = self.flow.answer.reply
        return reply is not None and reply.ended

    def end(self) -> bytes:
        """The stream's last bytes: what the splitter held (an unterminated event),
        through the reply machine, which also gives up the events it held for a
        verdict (a call whose name could still grow)."""
        tail = self.splitter.take()
        reply = self.flow.answer.reply
        if reply is None:
            return tail
        try:
            return reply.close(tail)
        except Exception:
            log.exception("stream processing failed at its end; passing the tail through")
            self.metrics.fail_open.labels("response").inc()
            return tail


__all__ = ["Through"]
