"""prefixpin's own server (``proxy.front``) serving any ASGI app, as ``prefixpin serve``
serves its own: ``python -m benchmarks.http.front MODULE:APP --port N``."""

from __future__ import annotations

import argparse
import importlib
import sys

import uvloop

from proxy.config import load
from proxy.front import Server, connection_cap, listen, serve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("app", help="module:attribute")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    module, _, name = args.app.partition(":")
    app = getattr(importlib.import_module(module), name)
    config = load()
    server = Server(
        app,
        limits=config.limits,
        max_connections=connection_cap(0, config.upstream.max_connections),
    )
    uvloop.run(serve(server, [listen("127.0.0.1", args.port)], grace_s=1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
