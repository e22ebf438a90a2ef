"""Talking to the upstream.

client.py       UpstreamClient: base URL, pooled transport, timeouts, at-most-once
transport.py    HTTP/1.1 on asyncio protocols + httptools: pooled, at-most-once, httpx's responses
litellm.py      upstream.kind: litellm (provider translation), imported lazily
target.py       the client's raw path on the upstream's base; climbing paths refused
headers.py      hop-by-hop and own headers never cross
passthrough.py  every other route, forwarded unchanged and streamed
policy.py       which replica of upstream.pool: the Policy protocol, round_robin, lineage
pool.py         one client per replica: health, in-flight load, failover before any byte left
"""

from __future__ import annotations

from proxy.upstream.client import UpstreamClient, upstream_url
from proxy.upstream.headers import request_headers, response_headers
from proxy.upstream.passthrough import passthrough
from proxy.upstream.target import client_path

__all__ = ["UpstreamClient", "client_path", "passthrough", "request_headers", "response_headers", "upstream_url"]
