"""Section 2c: serve each lineage where its prefix is cached.

The request's :class:`~proxy.upstream.policy.Route` names its lineage root (one id
for a lineage and all its forks), the replica the lineage's record says last served
it (a fork's record starts with its parent's; Record writes the replica that
answered) and whether the lineage is new (a root: it goes to the least loaded
replica).  The pool's policy places it (proxy.upstream.pool).  The record came with
the lineage lookup, so sharing the route through the store costs no extra round
trip.  This addon also

- pins the lineage to a slot of ``llama-server --parallel N``
  (``affinity.llama_slots``): ``id_slot`` added to the forwarded body as one
  member (every other byte as the client sent it); a body that names its own
  ``id_slot`` keeps it;
- sets each ``affinity.headers`` name to the key, replacing a client's own value.

A request without a lineage (bypassed, not JSON, failed open, store down) gets
no route, no slot and none of these headers.
"""

from __future__ import annotations

from collections import OrderedDict

from canonicalize import AddMember
from proxy.config import Affinity as AffinityConfig
from proxy.flow import Flow
from proxy.upstream.policy import Route


class SlotTable:
    """Lineage root -> llama-server slot, least-recently-used reassignment.

    Per process: with several prefixpin processes in front of one llama-server,
    each keeps its own table (route a lineage to one process, or use one process
    per llama-server, the sidecar deployment)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._owners: OrderedDict[str, int] = OrderedDict()

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

    def __init__(self, cfg: AffinityConfig) -> None:
        self.headers = tuple(h.lower() for h in cfg.headers)
        self.slots = SlotTable(cfg.llama_slots) if cfg.llama_slots > 0 else None

    async def request(self, flow: Flow) -> None:
        if flow.outcome is None or not flow.editable or flow.body is None:
            return
        record = flow.outcome.record
        root = record.root_id
        flow.route = Route(root, record.replica, new=flow.role == "root")
        flow.set_headers = tuple((h, root) for h in self.headers)
        if self.slots is not None and "id_slot" not in flow.body:
            slot = self.slots.slot(root)
            flow.ops.append(AddMember("id_slot", str(slot).encode()))
            flow.slot = slot
