"""Header hygiene: the ASGI-list (bytes) versions agree with the str ones."""

from __future__ import annotations

import httpx

from proxy.upstream.headers import (
    has_header,
    raw_request_headers,
    raw_response_headers,
    request_headers,
    response_headers,
)

REQUEST = [
    (b"host", b"x"),
    (b"connection", b"keep-alive, X-Hop-Secret"),
    (b"x-hop-secret", b"1"),
    (b"keep-alive", b"timeout=5"),
    (b"te", b"trailers"),
    (b"authorization", b"Bearer k"),
    (b"accept-encoding", b"gzip"),
    (b"x-prefixpin-bypass", b"1"),
    (b"content-length", b"2"),
    (b"x-keep", b"caf\xe9"),
]


def test_raw_request_headers_match_request_headers() -> None:
    decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in REQUEST]
    for identity in (False, True):
        assert raw_request_headers(REQUEST, identity=identity) == request_headers(decoded, identity=identity)
    assert raw_request_headers(REQUEST, identity=True) == [
        ("authorization", "Bearer k"),
        ("x-keep", "caf\xe9"),
        ("accept-encoding", "identity"),
    ]


def test_raw_response_headers_match_response_headers_and_keep_the_bytes() -> None:
    headers = httpx.Headers(
        [
            (b"Content-Type", b"text/event-stream"),
            (b"Connection", b"X-Resp-Hop"),
            (b"X-Resp-Hop", b"1"),
            (b"Vary", b"a"),
            (b"vary", b"b"),
            (b"Set-Cookie", b"a=1"),
            (b"Content-Encoding", b"gzip"),
            (b"Transfer-Encoding", b"chunked"),
            (b"X-Name", "naïve".encode()),
        ]
    )
    raw = raw_response_headers(headers, drop=(b"content-encoding",))
    plain = response_headers(headers, drop=("content-encoding",))
    assert [k.decode() for k, _ in raw] == list(plain)
    assert dict(raw) == {
        b"content-type": b"text/event-stream",
        b"vary": b"a, b",
        b"set-cookie": b"a=1",
        b"x-name": "naïve".encode(),  # as sent: not decoded and re-encoded
    }
    assert has_header(headers, b"content-encoding") and not has_header(headers, b"x-resp-keep")
