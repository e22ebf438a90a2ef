"""Who the request belongs to (see :mod:`proxy.tenancy`): lineages, pins and forks
never cross tenants."""

from __future__ import annotations

from proxy.config import Tenancy as TenancyConfig
from proxy.flow import Flow
from proxy.tenancy import tenant_of


class Tenancy:
    name = "tenancy"

    def __init__(self, config: TenancyConfig) -> None:
        self.policy = config

    async def request(self, flow: Flow) -> None:
        if flow.skip:
            return
        flow.tenant = tenant_of(flow.headers.raw, flow.query, self.policy)
