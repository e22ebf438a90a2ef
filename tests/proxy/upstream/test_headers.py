"""Header hygiene: the ASGI-list (bytes) versions agree with the str ones."""

from __future__ import annotations

from proxy.upstream.headers import (
    has_header,
    raw_request_headers,
    raw_response_headers,
    request_headers,
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


def test_raw_response_headers_drop_hop_by_hop_join_repeats_and_keep_the_bytes() -> None:
    headers = [
        (b"Content-Type", b"text/event-stream"),
        (b"Connection", b"X-Resp-Hop"),
        (b"X-Resp-Hop", b"1"),
        (b"Vary", b"a"),
        (b"vary", b"b"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
        (b"Content-Encoding", b"gzip"),
        (b"Transfer-Encoding", b"chunked"),
        (b"X-Name", "naïve".encode()),
    ]
    raw = raw_response_headers(headers, drop=(b"content-encoding",))
    assert raw == [
        (b"content-type", b"text/event-stream"),
        (b"vary", b"a, b"),
        (b"x-name", "naïve".encode()),  # as sent: not decoded and re-encoded
        (b"set-cookie", b"a=1"),  # each cookie its own header: they cannot be joined
        (b"set-cookie", b"b=2"),
    ]
    assert has_header(headers, b"content-encoding") and not has_header(headers, b"x-resp-keep")
