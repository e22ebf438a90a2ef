"""``x-prefixpin-bypass: 1``: forward the request untouched."""

from __future__ import annotations

from proxy.flow import Flow


class Bypass:
    name = "bypass"

    async def request(self, flow: Flow) -> None:
        if flow.headers.get("x-prefixpin-bypass", "").strip() == "1":
            flow.skip = True
            flow.role = "bypass"
