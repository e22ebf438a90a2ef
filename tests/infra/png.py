"""Read a PNG into pixels (8-bit RGB or RGBA, not interlaced: what Chromium's
screenshots are), with numpy and zlib only: enough for tests to look at a
screenshot without an imaging library."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type -> channels (RGB, RGBA)


def read(path: Path) -> NDArray[np.uint8]:
    """The image as an array of shape (height, width, 3): RGB, alpha dropped."""
    data = path.read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    pos, idat = len(SIGNATURE), bytearray()
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in CHANNELS or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
            channels = CHANNELS[colour]
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = np.frombuffer(zlib.decompress(bytes(idat)), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.int32)
    prev = np.zeros(width * channels, dtype=np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        out[y] = prev = _unfilter(int(kind), line, prev, channels)
    return out.reshape(height, width, channels)[:, :, :3].astype(np.uint8)


def _unfilter(kind: int, line: NDArray[np.int32], prev: NDArray[np.int32], bpp: int) -> NDArray[np.int32]:
    if kind == 0:
        return line
    if kind == 2:  # up
        return (line + prev) % 256
    if kind == 1:  # sub: each byte adds the one bpp before it, a running sum per channel
        return np.cumsum(line.reshape(-1, bpp), axis=0).reshape(-1) % 256
    cur, up = line.tolist(), prev.tolist()  # plain ints: the loop below is per byte
    for i in range(len(cur)):  # average and Paeth depend on the byte just decoded
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            cur[i] = (cur[i] + (a + b) // 2) & 255
        else:
            c = up[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.array(cur, dtype=np.int32)
