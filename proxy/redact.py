"""Keeping credentials out of text: upstream URLs, error details, access logs.

An upstream URL may carry a password (``http://user:pass@host``) or a key in
its query (``?api_key=...``); a client may put a key in its request's query.
Whatever prefixpin prints or logs goes through one of these first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
# Query parameter names that carry credentials (compared lower-case, "-" as "_").
_SECRET_NAME = re.compile(r"(key|token|secret|password|passwd|pwd|signature|sig|auth|authorization|credentials?)$")


def redact(url: str) -> str:
    """``url`` without userinfo, query or fragment: ``scheme://host:port/path``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<upstream>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(text: str) -> str:
    """``text`` with every URL in it redacted (exception messages may quote one)."""
    return _URL.sub(lambda m: redact(m.group()), text)


def is_secret_param(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.lower().replace("-", "_")))


def redact_query(target: str, names: frozenset[str] = frozenset()) -> str:
    """A request target (``/path?query``) with credential-like query values (and
    those of the parameters ``names``) replaced by ``***``."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    out = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        secret = is_secret_param(unquote_plus(name)) or unquote_plus(name).lower() in names
        out.append(f"{name}=***" if eq and secret else item)
    return f"{path}?{'&'.join(out)}"
