"""Certificates made in the test, with Debian's ``openssl``: a private CA, server
certificates it signs (for ``localhost`` and ``127.0.0.1``), client certificates
for mutual TLS, and server-side SSL contexts for raw upstreams."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(folder: Path, name: str = "prefixpin test CA") -> Pair:
    folder.mkdir(parents=True, exist_ok=True)
    pair = Pair(folder / f"{_slug(name)}.pem", folder / f"{_slug(name)}.key")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", str(pair.key), "-out", str(pair.cert),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    return pair


def issue(ca: Pair, folder: Path, name: str, *, client: bool = False) -> Pair:
    """A certificate for ``name`` signed by ``ca``: a server's (SANs localhost and
    127.0.0.1) or a client's."""
    slug = _slug(name)
    pair = Pair(folder / f"{slug}.pem", folder / f"{slug}.key")
    csr = folder / f"{slug}.csr"
    ext = folder / f"{slug}.ext"
    usage = "clientAuth" if client else "serverAuth"
    lines = [f"extendedKeyUsage={usage}", "basicConstraints=CA:FALSE"]
    if not client:
        lines.append("subjectAltName=DNS:localhost,IP:127.0.0.1")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(pair.key), "-out", str(csr),
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-days", "2", "-out", str(pair.cert), "-extfile", str(ext),
        cwd=folder,
    )  # fmt: skip
    return pair


def server_context(pair: Pair, *, client_ca: Pair | None = None) -> ssl.SSLContext:
    """What an HTTPS upstream serves with; ``client_ca``: it requires a client certificate signed by it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pair.cert, pair.key)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=client_ca.cert)
    return ctx


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
