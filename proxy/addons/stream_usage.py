"""A client that streams without asking for usage: ask the upstream for it (so
the request is measured), and have the reply machine remove what asking added."""

from __future__ import annotations

from proxy.flow import Flow


class StreamUsage:
    name = "stream_usage"

    async def request(self, flow: Flow) -> None:
        if not flow.editable or flow.body is None:
            return
        ops = flow.exchange.stream_usage(flow.body)
        if ops:
            flow.ops.extend(ops)
            flow.drop_usage_chunk = True
