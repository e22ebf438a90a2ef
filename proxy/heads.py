"""The bound on a request's or a response's head (``limits.max_header_bytes``), as
prefixpin's server and its upstream client both count it: the first line's counted
part (the target, or the reason), then each field's name and value with 4 bytes more
(": " and CRLF), as uvicorn and h11 count a head."""

from __future__ import annotations

from collections.abc import Sequence


def over(limit: int, read: int, fields: Sequence[tuple[bytes, bytes]], line: int) -> bool:
    """Is a head whose bytes all came in the last ``read`` bytes, with ``fields`` and a
    first line counting ``line``, over ``limit``?  Summed only when it can be: the sum
    is at most 5/4 of the bytes (a field's line is 4 bytes or more, counted one more
    when it has no space after the colon), so within the bound that many bytes cannot
    pass it."""
    if read * 5 <= limit * 4:
        return False
    return line + sum(len(k) + len(v) for k, v in fields) + 4 * len(fields) > limit


__all__ = ["over"]
