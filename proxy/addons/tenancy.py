"""Who the request belongs to (see :mod:`proxy.tenancy`): lineages, pins and forks
never cross tenants."""

from __future__ import annotations

from proxy.config import Tenancy as TenancyConfig
from proxy.flow import Flow, Skip, Tenant
from proxy.tenancy import tenant_of


class Tenancy:
    name = "tenancy"
    needs = (Skip,)
    provides = (Tenant,)

    def __init__(self, config: TenancyConfig) -> None:
        self.policy = config

    def request(self, flow: Flow) -> None:
        if flow.get(Skip) is None:
            inbound = flow.inbound
            flow.decide(Tenant(tenant_of(inbound.headers.raw, inbound.query, self.policy)))
