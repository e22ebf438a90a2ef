"""prefixpin's HTTP/1.1 server: ASGI apps served on httptools' parser.

connection.py   one client connection: requests parsed and bounded (head size and
                deadline, body size and deadline), trailers dropped, Upgrade
                ignored, pipelined requests answered in order
cycle.py        one request/response as ASGI sees it: receive, send, the framing
server.py       listening, the lifespan, the cap on open connections, stopping

Why prefixpin serves itself instead of through uvicorn: proxy/cli/serve.py.
"""

from __future__ import annotations

from proxy.config import Limits
from proxy.front.connection import Connection
from proxy.front.cycle import Cycle
from proxy.front.server import Lifespan, Server, claim, connection_cap, listen, serve

__all__ = ["Connection", "Cycle", "Lifespan", "Limits", "Server", "claim", "connection_cap", "listen", "serve"]
