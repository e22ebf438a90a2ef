"""A repaired fork is offered its parent's tools[]: the reply machine removes
calls to tools the fork did not itself offer, before the client sees them."""

from __future__ import annotations

from proxy.flow import Flow


class ForkGuard:
    name = "fork_guard"

    async def request(self, flow: Flow) -> None:
        if flow.editable and flow.outcome is not None:
            flow.offered = flow.outcome.offered
