"""After the response: record the turn (:mod:`canonicalize.turn`): the lineage,
its links, the reply's link and any new blobs (the system part and tools[] as
forwarded), in one store write with the Responses API response id and what
learning leaves to the tenant's other conversations (its evidence, a new root's
marked links).

When: ``store.shared`` says (proxy.store.Store).  The memory store's writes
never wait: the turn is recorded right after the response's last byte, before
the event loop can read the client's next request.  A shared store's (Redis) go
over the network in a task (``flow.recording``), which the handler awaits before
the response's last bytes.
A request the upstream failed is recorded too, so a retry finds its lineage.
The record names the pool replica that answered (section 2c: every process
sharing the store routes the lineage's next request there) and, when
``provider_cache.diagnostics`` asks for it, the id of the Messages response (the
lineage's next request names it to Anthropic).

Blobs are stored once per conversation by content ref: a lineage's new system
part or tools[] is extracted from the forwarded body and written; one it recorded
before is only touched (kept alive).  When the store answers that a touched blob
is gone (evicted, or lost with the data of a restarted or failed-over Redis), it
is extracted and written again at once, so later forks find it: nothing in this
process remembers what the store holds.  A request of the isolated tenant (no
credential) records nothing at all."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from proxy.drive import Driver
from proxy.flow import Flow
from proxy.services import Services
from proxy.store import ISOLATED


class Record:
    name = "record"
    counts_only = False  # the next turn's lookup needs it: right at the response's end

    def __init__(self, s: Services, driver: Driver) -> None:
        self.s = s
        self.driver = driver

    def done(self, flow: Flow) -> None:
        if flow.outcome is None or flow.done is None or flow.failed or flow.tenant == ISOLATED:
            return
        if not self.s.store.shared and not flow.big:
            _run_inline(self._record(flow))
        else:
            flow.recording = self.s.spawn(self._record(flow))

    async def _record(self, flow: Flow) -> None:
        outcome, done = flow.outcome, flow.done
        assert outcome is not None and done is not None
        record = outcome.record if flow.replica is None else outcome.record.evolve(replica=flow.replica)
        message_id = flow.reply.usage.message_id if flow.keep_message_id and flow.reply is not None else None
        if message_id is not None and flow.status < 400:  # the next turn's diagnostics.previous_message_id
            record = record.evolve(message_id=message_id)
        reply = flow.message if flow.status < 400 else None
        await self.driver.record(flow.tenant, done, flow.out, reply, record, big=flow.big)


def _run_inline(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends (the memory store's calls) to its end, now."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a store that records inline waited")
