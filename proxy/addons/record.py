"""After the response: record the turn (:mod:`canonicalize.turn`): the lineage,
its links, the reply's link and any new blobs (the system part and tools[] as
forwarded), in one store write with the Responses API response id and what
learning leaves to the tenant's other conversations (its evidence, a new root's
marked links).

When: the store says (``Store.records_at``, proxy.store).  The memory store's
writes never wait: the turn is recorded right after the response's last byte,
before the event loop can read the client's next request.  A shared store's
(Redis: other processes read it) go over the network just before the response's
last bytes, so whichever process gets the next turn finds it.
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

from collections.abc import Awaitable

from canonicalize import Canonicalized
from proxy.drive import Driver
from proxy.flow import CacheControls, Flow, Tenant
from proxy.services import Services
from proxy.store import ISOLATED


class Record:
    name = "record"
    needs = (Tenant, Canonicalized, CacheControls)

    def __init__(self, s: Services, driver: Driver) -> None:
        self.s = s
        self.driver = driver
        self.when = s.store.records_at  # the next turn's lookup needs it: at the response's end

    def done(self, flow: Flow) -> Awaitable[None] | None:
        """The turn's write, to await (None: nothing to record, or written off the
        request's end)."""
        done, tenant = flow.done, flow.tenant
        outcome = done.outcome if done is not None else None
        if done is None or outcome is None or tenant == ISOLATED:
            return None
        answer, controls = flow.answer, flow.get(CacheControls)
        record = controls.record if controls is not None and controls.record is not None else outcome.record
        if answer.replica is not None:
            record = record.evolve(replica=answer.replica)
        if controls is not None and controls.keep_message_id and answer.reply is not None and answer.status < 400:
            message_id = answer.reply.usage.message_id  # the next turn's diagnostics.previous_message_id
            if message_id is not None:
                record = record.evolve(message_id=message_id)
        reply = answer.message if answer.status < 400 else None
        big = flow.big
        write = self.driver.record(tenant, done, flow.out, reply, record, big=big)
        if big and self.when == "after_last_byte":
            self.s.spawn(write)  # its blobs are cut on a worker thread: the response is not held for it
            return None
        return write
