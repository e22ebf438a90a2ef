"""The HTTP layers prefixpin owns, next to the libraries it could use instead
(``python -m benchmarks.bench_http``).

env.py        the cache venv the other servers and clients are installed into (pinned)
apps.py       the ASGI apps each server serves: prefixpin's real app, and a probe app
servers.py    our front, uvicorn (httptools, h11), granian, hypercorn: CPU per request
              serving prefixpin's app, and how each meets a hostile client
upstream.py   a scripted upstream for the clients: JSON, a 1,000-event stream, bombs
clients.py    our client, aiohttp, httpx, pyreqwest (Rust): CPU per request, and how
              each meets a hostile upstream; run in the cache venv, prints JSON
"""
