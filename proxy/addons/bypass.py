"""``x-prefixpin-bypass: 1``: forward the request untouched."""

from __future__ import annotations

from proxy.flow import Flow, bypassed


class Bypass:
    name = "bypass"

    async def request(self, flow: Flow) -> None:
        if bypassed(flow.headers):
            flow.skip = True
            flow.role = "bypass"
