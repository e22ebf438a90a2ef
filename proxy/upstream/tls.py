"""The TLS context for HTTPS upstreams (``upstream.tls``, SPEC section 2f).

Verification trusts, in this order of choice:

- ``upstream.tls.ca_file``: that bundle only (as ``curl --cacert`` and httpx's
  ``verify=PATH``: a private CA's upstream is trusted for what that CA signed);
- else ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when the environment sets them (as
  OpenSSL and every client built on it do);
- else the system's CA store (Debian's ``ca-certificates``), or certifi's bundle
  where the system has none (a slim container).

``verify: false`` turns verification off (the server logs a warning at start);
``cert_file`` (and ``key_file``, when the key is not in the same file) presents a
client certificate for mutual TLS.  The context offers ``http/1.1`` by ALPN: the
transport speaks nothing else.
"""

from __future__ import annotations

import os
import ssl

from proxy.config import Tls


def context(tls: Tls, *, env_ca_file: str | None = None, env_ca_dir: str | None = None) -> ssl.SSLContext:
    """The client context for ``tls``; raises ``ssl.SSLError`` / ``OSError`` for files
    that cannot be loaded (the config check reports them naming the key)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif tls.ca_file:
        ctx.load_verify_locations(cafile=tls.ca_file)
    elif env_ca_file or env_ca_dir:
        ctx.load_verify_locations(cafile=env_ca_file or None, capath=env_ca_dir or None)
    elif _system_store():
        ctx.load_default_certs()
    else:
        import certifi  # the fallback where the system has no CA store

        ctx.load_verify_locations(cafile=certifi.where())
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _system_store() -> bool:
    paths = ssl.get_default_verify_paths()
    if paths.cafile and os.path.isfile(paths.cafile):
        return True
    return bool(paths.capath and os.path.isdir(paths.capath) and os.listdir(paths.capath))


def describe(exc: BaseException, host: str) -> str:
    """What failed in a TLS handshake with ``host``, for the client's 502 and /readyz."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or "the certificate is not trusted"
        return f"TLS certificate verification failed for host {host}: {reason}"
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if isinstance(reason, str):
        reason = reason.replace("_", " ").lower()  # "TLSV13_ALERT_CERTIFICATE_REQUIRED" -> readable
        if reason in _NOT_TLS:
            reason += " (the upstream answered in plain HTTP, not TLS: is its URL http://?)"
    return f"the TLS handshake with host {host} failed: {reason}"


# What OpenSSL says when the answer to its hello is not TLS at all ("HTTP/1.1 400 ..."):
_NOT_TLS = frozenset({"wrong version number", "http request", "packet length too long", "record layer failure"})


__all__ = ["context", "describe"]
