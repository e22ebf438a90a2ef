"""Which transport carries upstream requests, from the config.

``upstream.kind: openai`` (the default): prefixpin's HTTP/1.1 connections
(:mod:`proxy.upstream.connections`) with the TLS context of ``upstream.tls`` and
the egress proxy of ``upstream.proxy`` or the environment.  ``litellm``: chat
completions through LiteLLM, every other route through those same connections.
Tests hand in an ``httpx`` transport (``httpx.MockTransport``), adapted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from proxy.config import Config
from proxy.upstream import tls
from proxy.upstream.adapter import HttpxTransport
from proxy.upstream.connections import Connections
from proxy.upstream.egress import Egress
from proxy.upstream.message import Transport

log = logging.getLogger("prefixpin")


def open_transport(config: Config, replacement: Any = None, listening: Sequence[tuple[str, int]] = ()) -> Transport:
    """The transport every replica of the upstream shares; ``replacement`` (an httpx
    transport) stands in for the network in unit tests; ``listening``: this process's
    listening addresses, where no request may go."""
    up, env = config.upstream, config.environment
    if replacement is not None:
        base: Transport = HttpxTransport(replacement)
    else:
        if not up.tls.verify:
            log.warning("upstream.tls.verify is false: prefixpin does not check the upstream's TLS certificate")
        context = tls.context(up.tls, env_ca_file=env.ssl_cert_file, env_ca_dir=env.ssl_cert_dir)
        base = Connections(
            max_connections=up.max_connections,
            tls=context,
            egress=Egress(up.proxy, env),
            max_header_bytes=config.limits.max_header_bytes,
            listening=listening,
        )
    if up.kind == "litellm":
        from proxy.upstream.litellm import LiteLLMTransport

        return LiteLLMTransport(config, base)
    return base


__all__ = ["open_transport"]
