"""Section 2c: serve each lineage where its prefix is cached.

The request's :class:`~proxy.upstream.policy.Route` names its lineage root (one id
for a lineage and all its forks), the replica the lineage's record says last served
it (a fork's record starts with its parent's; Record writes the replica that
answered) and whether the lineage is new (a root: it goes to the least loaded
replica).  The pool's policy places it (proxy.upstream.pool).  The record came with
the lineage lookup, so sharing the route through the store costs no extra round
trip.  This addon also

- pins the lineage to a slot of llama-server (``affinity.llama_slots``):
  ``id_slot`` added to the forwarded body as one member (every other byte as the
  client sent it); a body that names its own ``id_slot`` keeps it.  Whether it pins
  follows what the server does with its slots, read from its ``/slots`` off the
  request path (proxy.upstream.slots: every lineage where slots keep their prompts;
  none where the server clears idle slots into its RAM prompt cache, llama-server's
  defaults, as pinning skips the cache's restore; carefully until it is seen);
- sets each ``affinity.headers`` name to the key, replacing a client's own value.

A request without a lineage (bypassed, not JSON, failed open, store down) gets
no route, no slot and none of these headers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable

from canonicalize import AddMember, Canonicalized
from proxy.config import Affinity as AffinityConfig
from proxy.flow import Edits, Flow, Placement
from proxy.upstream.policy import Route
from proxy.upstream.slot_watch import SlotWatch
from proxy.upstream.slots import SlotPlan


class SlotTable:
    """Lineage root -> llama-server slot, least-recently-used reassignment.

    Per process: with several prefixpin processes in front of one llama-server,
    each keeps its own table (route a lineage to one process, or use one process
    per llama-server, the sidecar deployment).  One table serves every replica of a
    pool."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._owners: OrderedDict[str, int] = OrderedDict()

    def get(self, root: str) -> int | None:
        """``root``'s slot, if it has one (not touched)."""
        return self._owners.get(root)

    def slot(self, root: str) -> int:
        """``root``'s slot, assigning the least recently used one when it has none."""
        slot = self._owners.get(root)
        if slot is not None:
            self._owners.move_to_end(root)
            return slot
        if len(self._owners) < self.slots:
            slot = len(self._owners)
        else:
            _, slot = self._owners.popitem(last=False)
        self._owners[root] = slot
        return slot


class Affinity:
    name = "affinity"
    needs = (Canonicalized,)
    provides = (Placement, Edits)
    when = "after_last_byte"  # its done hook only asks for a read of /slots, right away

    def __init__(self, cfg: AffinityConfig, watch: SlotWatch | None = None) -> None:
        """``watch``: the servers' slots as read (the app's); without it an explicit
        ``llama_slots`` pins every lineage."""
        self.headers = tuple(h.lower() for h in cfg.headers)
        self.watch = watch
        n = cfg.llama_slots
        self._fixed = SlotPlan("all", n, "configured") if n != "auto" and n > 0 else SlotPlan("none", 0, "off")
        self.table: SlotTable | None = None

    def request(self, flow: Flow) -> Awaitable[None] | None:
        watch = self.watch
        if watch is not None and not watch.settled.is_set():
            return self._settled(flow)  # at start only: the first read (and probe) of the servers
        self._place(flow)
        return None

    async def _settled(self, flow: Flow) -> None:
        assert self.watch is not None
        await self.watch.settle()
        self._place(flow)

    def _place(self, flow: Flow) -> None:
        watch = self.watch
        last = None
        if watch is not None:
            last, watch.last_sent = watch.last_sent, None
        outcome = flow.outcome
        if outcome is None or flow.failed:
            return
        root = outcome.record.root_id
        route = Route(root, outcome.record.replica, new=flow.role == "root")
        out = flow.outbound
        out.headers += tuple((h, root) for h in self.headers)
        if watch is not None:
            watch.last_sent = (root, None)
        slot = self._slot(flow, root, route.new, last)
        flow.decide(Placement(route, slot))
        if slot is not None:
            out.ops.append(AddMember("id_slot", str(slot).encode()))
            if watch is not None:
                watch.last_sent = (root, slot)

    def _slot(self, flow: Flow, root: str, new: bool, last: tuple[str, int | None] | None) -> int | None:
        """The llama-server slot to pin the lineage to, if any."""
        plan = self.watch.plan if self.watch is not None else self._fixed
        done = flow.done
        if plan.mode == "none" or done is None or "id_slot" in done.body:
            return None
        table = self.table
        if table is None or table.slots != plan.slots:
            table = self.table = SlotTable(plan.slots)
        if plan.mode == "careful":
            # A new lineage takes a slot of its own; a lineage goes back to its slot
            # only when that slot served the last request sent (it holds the prompt on
            # any server).  Anything else names no slot until the server is known.
            mine = table.get(root)
            if not (new or (mine is not None and last == (root, mine))):
                return None
        return table.slot(root)

    def done(self, flow: Flow) -> None:
        if self.watch is not None:
            self.watch.poke()
