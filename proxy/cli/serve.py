"""``prefixpin serve`` in this process: the app on prefixpin's HTTP/1.1 server.

Why not uvicorn: its httptools protocol appends a chunked body's trailer fields
to the request's headers (a trailer ``Authorization`` or ``x-prefixpin-tenant``
was forwarded and acted on) and bounds neither the size of a request head (96
MiB of headers were accepted) nor the number of open connections; none of that
can be changed through its public interface.  Its h11 protocol has neither flaw
but parses in Python: serving a trivial ASGI app a 45 KB POST (wrk, one and 16
connections, this 2-core machine) it answers at p50 220-260 µs and 4,700-5,200
req/s, against 81-106 µs and 10,000-24,000 req/s for httptools, uvicorn's or
this server's (the two are within noise of each other).  :mod:`proxy.front`
parses with the same C parser and answers each flaw by design.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

from proxy.config import Config
from proxy.front import Server, connection_cap, listen, serve
from proxy.redact import redact

log = logging.getLogger("prefixpin")


def setup_logging(config: Config) -> None:
    logging.basicConfig(level=config.log.level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # LiteLLM's client: one line per request is noise
    logging.getLogger("prefixpin.access").setLevel(logging.INFO if config.log.access else logging.WARNING)


def serve_here(config: Config, *, sock: socket.socket | None = None, banner: bool = True) -> int:
    """Serve until SIGTERM / SIGINT; 3 when the app cannot start (the reason is logged)."""
    from proxy.app import create_app

    app = create_app(config)
    server = Server(
        app,
        limits=config.limits,
        max_connections=connection_cap(config.limits.max_connections, config.upstream.max_connections),
        secret_params=frozenset(p.lower() for p in config.tenancy.credential_params),
        on_refused=app.refused,
    )
    if sock is None:
        try:
            sock = listen(config.listen.host, config.listen.port)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", config.listen.host, config.listen.port, exc.strerror)
            return 3
    app.listening = (sock.getsockname()[:2],)  # an upstream that resolves to it is refused
    tune_gc()

    def ready() -> None:
        if banner:
            log.info(
                "prefixpin serving on http://%s:%d -> %s (store: %s, packs: %s)",
                config.listen.host,
                config.listen.port,
                redact(config.upstream.url),
                config.store.backend,
                ",".join(config.canonicalize.packs),
            )

    try:
        _run(serve(server, [sock], grace_s=config.listen.shutdown_grace_s, on_ready=ready))
    except RuntimeError as exc:  # the app's lifespan failed: logged with its reason
        log.error("prefixpin did not start: %s", exc)
        return 3
    return 0


def tune_gc() -> None:
    """The cyclic garbage collector as a proxy needs it.  Each request allocates tens of
    thousands of short-lived, acyclic JSON objects that reference counting frees; the
    default threshold (700) made the collector run several times per request,
    scanning every long-lived object.  What exists now (the app, the rules) is never
    scanned again."""
    gc.freeze()
    gc.set_threshold(200_000, 50, 100)


def _run(main: object) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]


__all__ = ["serve_here", "setup_logging", "tune_gc"]
