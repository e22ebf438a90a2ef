"""Who the request belongs to (see :mod:`proxy.tenancy`): lineages, pins and forks
never cross tenants."""

from __future__ import annotations

from starlette.datastructures import QueryParams

from proxy.config import Tenancy as TenancyConfig
from proxy.flow import Flow
from proxy.tenancy import tenant_of

_NO_QUERY = QueryParams("")


class Tenancy:
    name = "tenancy"

    def __init__(self, config: TenancyConfig) -> None:
        self.policy = config

    async def request(self, flow: Flow) -> None:
        if flow.skip:
            return
        query = QueryParams(flow.query) if flow.query else _NO_QUERY  # most requests have none to parse
        flow.tenant = tenant_of(flow.headers, query, self.policy)
