"""Talking to the upstream.

message.py      Request, Response, Body, Transport: what every transport speaks
client.py       UpstreamClient: base URL, timeouts, at-most-once sending
transport.py    which transport, from the config (ours, LiteLLM's, a test's)
connections.py  prefixpin's transport: pooled HTTP/1.1 connections, direct or via a proxy, plain or TLS
http11.py       one connection: the request out, the response parsed strictly (httptools)
tls.py          the TLS context: system CAs, SSL_CERT_FILE/DIR, a private CA, mTLS
egress.py       egress proxies: HTTPS_PROXY / HTTP_PROXY / NO_PROXY, CONNECT tunnels
cap.py          the cap on open connections: slots and released connections handed to waiters
decode.py       gzip / deflate / br bodies undone in bounded slices; corrupt or cut codings refused
reading.py      a body read within limits.max_decoded_bytes, decoded with the loop's turns between slices
adapter.py      an httpx transport (LiteLLM's, tests') as ours: no httpx type goes further
litellm.py      upstream.kind: litellm (provider translation), imported lazily
target.py       the client's raw path on the upstream's base; climbing paths refused
headers.py      hop-by-hop and own headers never cross
policy.py       which replica of upstream.pool: the Policy protocol, round_robin, lineage
live.py         this process's live lineages per replica (the load a new lineage is placed by)
pool.py         one client per replica: health, in-flight load, failover before any byte left
slots.py        what llama-server does with its slots, judged from its /slots (affinity.llama_slots)
slot_watch.py   reading each replica's /props and /slots, off the request path
"""

from __future__ import annotations

from proxy.upstream.client import UpstreamClient, upstream_url
from proxy.upstream.headers import request_headers
from proxy.upstream.target import client_path

__all__ = ["UpstreamClient", "client_path", "request_headers", "upstream_url"]
