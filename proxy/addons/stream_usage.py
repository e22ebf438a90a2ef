"""A client that streams without asking for usage: ask the upstream for it (so
the request is measured), and have the reply machine remove what asking added."""

from __future__ import annotations

from canonicalize import Canonicalized
from proxy.flow import Edits, Flow, UsageAsked


class StreamUsage:
    name = "stream_usage"
    needs = (Canonicalized,)
    provides = (UsageAsked, Edits)

    def request(self, flow: Flow) -> None:
        done = flow.done
        if done is None or flow.failed:
            return
        ops = flow.inbound.exchange.stream_usage(done.body)
        if ops:
            flow.outbound.ops.extend(ops)
            flow.decide(UsageAsked())
