"""``x-prefixpin-bypass: 1``: forward the request untouched."""

from __future__ import annotations

from proxy.flow import SKIP, Flow, Skip


class Bypass:
    name = "bypass"
    needs: tuple[type, ...] = ()
    provides = (Skip,)

    def request(self, flow: Flow) -> None:
        if flow.inbound.bypassed:
            flow.decide(SKIP)
