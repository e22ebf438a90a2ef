"""The clients compared, each in a process of its own in the cache venv:

    python -m benchmarks.http.clients bench --client aiohttp --base URL --kind json --n 2000
    python -m benchmarks.http.clients probe --client aiohttp --base URL

prints one JSON object.  ``bench``: CPU microseconds per request (this process's CPU
time, every thread, over ``n`` requests, 4 at a time, after a warm-up) for ``json``
(a 45 KB POST, a chat completion back) or ``stream`` (a 1,000-event stream read to
its end, its bytes not parsed).  ``probe``: how the client meets the upstream's
hostile answers (``benchmarks.http.upstream``).

    ours       proxy.upstream.connections (what prefixpin sends with), with
               proxy.upstream.reading's bounded decoder for compressed bodies
    aiohttp    ClientSession;  httpx  AsyncClient;  pyreqwest  its async Client (Rust)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop

from benchmarks.overhead import body as hermes
from proxy.upstream.connections import Connections
from proxy.upstream.decode import decoder
from proxy.upstream.message import Request, Response, Timeouts
from proxy.upstream.reading import Decoded
from proxy.upstream.target import Base

MiB = 1 << 20
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
CLIENTS = ("ours", "aiohttp", "httpx", "pyreqwest")


class Client:
    """One library behind the three calls the benchmark makes."""

    async def post(self, url: str, body: bytes) -> bytes:
        raise NotImplementedError

    def chunks(self, url: str, body: bytes | None = None) -> AsyncGenerator[bytes, None]:
        """The response body's pieces as the library hands them over (decoded)."""
        raise NotImplementedError

    async def close(self) -> None: ...


class Ours(Client):
    def __init__(self, proxy: str | None = None) -> None:
        from proxy.config import Environment
        from proxy.upstream.egress import Egress

        egress = Egress(proxy, Environment()) if proxy else None
        self.t = Connections(max_connections=64, egress=egress)

    def _request(self, method: str, url: str, body: bytes) -> Request:
        base = Base.parse(url)
        target = base.path or "/"
        return Request(method, base.origin_parts, target, list(HEADERS.items()), body, Timeouts(10, 30, 30))

    async def post(self, url: str, body: bytes) -> bytes:
        r = await self.t.send(self._request("POST", url, body))
        return await r.read()

    async def chunks(self, url: str, body: bytes | None = None) -> AsyncGenerator[bytes, None]:
        r: Response = await self.t.send(self._request("POST" if body else "GET", url, body or b""))
        d = decoder(r.header(b"content-encoding"))
        source = Decoded(r.body, d) if d is not None else r.body
        try:
            async for piece in source:
                yield piece
        finally:
            await r.aclose()

    async def close(self) -> None:
        await self.t.aclose()


class Aiohttp(Client):
    def __init__(self, proxy: str | None = None) -> None:
        import aiohttp

        self.proxy = proxy
        self.s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64), headers=HEADERS)

    async def post(self, url: str, body: bytes) -> bytes:
        async with self.s.post(url, data=body) as r:
            return await r.read()

    async def chunks(self, url: str, body: bytes | None = None) -> AsyncGenerator[bytes, None]:
        method = "POST" if body else "GET"
        async with self.s.request(method, url, data=body, proxy=self.proxy) as r:
            async for piece in r.content.iter_any():
                yield piece

    async def close(self) -> None:
        await self.s.close()


class Httpx(Client):
    def __init__(self, proxy: str | None = None) -> None:
        import httpx

        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.c = httpx.AsyncClient(headers=HEADERS, limits=limits, proxy=proxy, trust_env=False, timeout=30)

    async def post(self, url: str, body: bytes) -> bytes:
        r = await self.c.post(url, content=body)
        return r.content

    async def chunks(self, url: str, body: bytes | None = None) -> AsyncGenerator[bytes, None]:
        async with self.c.stream("POST" if body else "GET", url, content=body) as r:
            async for piece in r.aiter_bytes():
                yield piece

    async def close(self) -> None:
        await self.c.aclose()


class Pyreqwest(Client):
    def __init__(self, proxy: str | None = None) -> None:
        client = importlib.import_module("pyreqwest.client")
        builder = client.ClientBuilder().default_headers(HEADERS)
        if proxy:
            builder = builder.proxy(importlib.import_module("pyreqwest.proxy").ProxyBuilder.http(proxy))
        self.c: Any = builder.build()

    async def post(self, url: str, body: bytes) -> bytes:
        r = await self.c.post(url).body_bytes(body).build().send()
        return bytes(await r.bytes())

    async def chunks(self, url: str, body: bytes | None = None) -> AsyncGenerator[bytes, None]:
        req = (self.c.post(url).body_bytes(body) if body else self.c.get(url)).build_streamed()
        async with req as r:
            reader = r.body_reader
            while (piece := await reader.read_chunk()) is not None:
                yield bytes(piece)

    async def close(self) -> None:
        await self.c.close()


def make(name: str, proxy: str | None = None) -> Client:
    return {"ours": Ours, "aiohttp": Aiohttp, "httpx": Httpx, "pyreqwest": Pyreqwest}[name](proxy)


# -- bench ---------------------------------------------------------------------------------------------------


async def bench(name: str, base: str, kind: str, n: int, concurrency: int = 4) -> dict[str, Any]:
    client = make(name)
    body = hermes.templates(stream=kind == "stream")[0].replace("@@SEQ@@", "1").replace("@@MM@@", "00")
    data = body.replace("@@GEN@@", "0").encode()
    url = base + ("/stream" if kind == "stream" else "/json")

    async def one() -> int:
        if kind == "json":
            return len(await client.post(url, data))
        return sum([len(p) async for p in client.chunks(url, data)])

    async def worker(count: int) -> int:
        return sum([await one() for _ in range(count)])

    try:
        await asyncio.gather(*(worker(50 // concurrency) for _ in range(concurrency)))  # warm-up
        t0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    finally:
        await client.close()
    done = concurrency * (n // concurrency)
    return {"client": name, "kind": kind, "requests": done, "cpu_us": cpu / done * 1e6, "wall_s": wall}


# -- probes ----------------------------------------------------------------------------------------------------


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def probe(name: str, base: str) -> dict[str, str]:
    out: dict[str, str] = {}
    client = make(name)
    try:
        try:
            await client.post(base + "/head", b"{}")
            out["1 MiB head"] = "took it"
        except Exception as exc:  # any library's error: refused
            out["1 MiB head"] = f"ok: refused ({type(exc).__name__})"
        out["bomb"] = await _bomb(client, base)
        out["slow reader"] = await _slow(client, base)
    finally:
        await client.close()
    out["idna"] = await _idna(name, base)
    return out


async def _bomb(client: Client, base: str) -> str:
    before, peak, largest, total = _rss(), 0, 0, 0
    try:
        async for piece in client.chunks(base + "/bomb"):
            largest, total = max(largest, len(piece)), total + len(piece)
            peak = max(peak, _rss() - before)
            del piece
    except Exception as exc:
        return f"failed ({type(exc).__name__})"
    verdict = "ok: " if largest <= MiB else ""
    return f"{verdict}largest piece {largest // 1024} KiB, held {peak / MiB:.0f} MiB ({total // MiB} MiB read)"


async def _slow(client: Client, base: str) -> str:
    """The first piece of 64 MiB, then nothing read for 2 s: how much did the library take in?"""
    before = _rss()
    chunks = client.chunks(base + "/big")
    try:
        await anext(chunks)
        peak = 0
        for _ in range(20):
            await asyncio.sleep(0.1)
            peak = max(peak, _rss() - before)
    finally:
        await chunks.aclose()
    held = peak / MiB
    return f"ok: held {held:.0f} MiB" if held < 16 else f"held {held:.0f} MiB"


async def _idna(name: str, base: str) -> str:
    port = urlsplit(base).port
    client = make(name, proxy=f"http://127.0.0.1:{port}")
    try:
        seen = json.loads(b"".join([p async for p in client.chunks("http://bücher.example/")]))
    except Exception as exc:
        return f"failed ({type(exc).__name__}: {str(exc)[:60]})"
    finally:
        await client.close()
    host = str(seen.get("host", ""))
    return f"ok: {host}" if host.startswith("xn--") else f"sent {host!r}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("bench", "probe"))
    ap.add_argument("--client", choices=CLIENTS, required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--kind", choices=("json", "stream"), default="json")
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    if args.what == "bench":
        result: dict[str, Any] = uvloop.run(bench(args.client, args.base, args.kind, args.n))
    else:
        result = uvloop.run(probe(args.client, args.base))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
