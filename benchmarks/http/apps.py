"""The ASGI apps the compared servers serve (``module:attribute`` for each server's CLI).

``prefixpin``  prefixpin's real app (``proxy.app.create_app``), its config from the
               environment (``PREFIXPIN_UPSTREAM``, ``PREFIXPIN_CONFIG``) as ``serve`` reads it
``probe``      what a probe needs to see of a server: the request's headers as JSON
               (``/headers``), ``/big`` 64 MiB in 256 KiB pieces (does the server hold
               it for a client that does not read?), anything else a short answer
"""

from __future__ import annotations

import json
from typing import Any

from proxy.app import create_app
from proxy.cli.serve import tune_gc
from proxy.config import load

prefixpin = create_app(load())
tune_gc()  # as ``prefixpin serve`` tunes the collector for its app, for every server alike

PIECE = b"x" * (256 * 1024)
BIG = 64 * 1024 * 1024


async def probe(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/big":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for _ in range(BIG // len(PIECE)):
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    seen = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]]
    body = json.dumps({"method": scope["method"], "path": scope["path"], "headers": seen}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["prefixpin", "probe"]
