"""A repaired fork is offered its parent's tools[]: the reply machine removes
calls to tools the fork did not itself offer, before the client sees them."""

from __future__ import annotations

from canonicalize import Canonicalized
from proxy.flow import Flow, Guarded


class ForkGuard:
    name = "fork_guard"
    needs = (Canonicalized,)
    provides = (Guarded,)

    def request(self, flow: Flow) -> None:
        outcome = flow.outcome
        if outcome is not None and outcome.offered is not None and not flow.failed:
            flow.decide(Guarded(outcome.offered))
