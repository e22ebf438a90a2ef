"""Memory stays bounded: prefixpin's RSS over 100,000 distinct conversations.

    python -m benchmarks.bench_memory              # 1,000 tenants x 100 conversations x 2 turns (~5 min on 2 cores)
    python -m benchmarks.bench_memory --smoke      # 20 x 10 x 2: proves the script works (CI)
    python -m benchmarks.bench_memory --tenants 500 --conversations 200 --turns 3 --every 10000

Starts the instant Go upstream (benchmarks/overhead/upstream) and ``prefixpin
serve`` (default config: memory store, default bounds) in front of it, then
plays distinct conversations through it from a small asyncio HTTP/1.1 client
with ``--concurrency`` keep-alive connections.  Every tenant has its own API
key; every conversation has its own system prompt (a session line, like
hermes-agent's) and first question, so each one records new links, a new
lineage and a new system blob; turn *n* sends the previous turns with the
upstream's answers.  Every ``--every`` requests it samples the server's RSS
(``VmRSS`` of /proc/<pid>/status).

A bounded store shows RSS rising while the store fills and then levelling off
once ``store.max_entries`` (200,000) is reached; a leak keeps rising with the
requests.  The report compares the growth per 10,000 requests over the last
half of the run with the first half.  A benchmark, not a test: it asserts
nothing about memory or time; it exits non-zero if a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.overhead import targets, tools
from benchmarks.overhead.tools import BIN_DIR, Unavailable
from tests.infra.procs import start_prefixpin

SYSTEM = (
    "You are a careful coding assistant for tenant {t}. Answer briefly, show the command first, then one line "
    "of why. Prefer reversible actions; never run destructive commands without asking. Use metric units and "
    "ISO dates. When a test fails, read the error, form a hypothesis, and test it; do not retry blindly. "
    "Quote paths exactly. Keep a todo list for multi-step tasks.\n\nSession ID: 2026{t:04d}_{c:06d}\n"
)
QUESTION = "Conversation {c} of tenant {t}: the nightly job {c} failed with exit code {e}; what should I check first?"
FOLLOW_UP = "Turn {n}: I checked that for job {c}; the log says 'permission denied' on /srv/data/{c}. Next step?"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Client:
    """One keep-alive HTTP/1.1 connection; just enough protocol for Content-Length responses."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, key: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw.split(b" ", 2)[1])
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", raw)
        data = await self.reader.readexactly(int(length.group(1))) if length else b""
        if length is None or re.search(rb"(?i)\r\nconnection: *close", raw):
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def roles(base: str) -> dict[str, int]:
    """Requests by role (root, continuation, ...) as /metrics counts them: proves the turns continue."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    pattern = r'^prefixpin_requests_total\{role="([^"]+)",route="chat_completions",status="200"\} (\S+)$'
    return {m[1]: int(float(m[2])) for m in re.finditer(pattern, text, re.M) if float(m[2])}


def conversation_turns(t: int, c: int, turns: int) -> list[list[dict[str, str]]]:
    """The user messages of each turn (the assistant answers are filled in as they come)."""
    first = [
        {"role": "system", "content": SYSTEM.format(t=t, c=c)},
        {"role": "user", "content": QUESTION.format(t=t, c=c, e=1 + c % 126)},
    ]
    return [first] + [[{"role": "user", "content": FOLLOW_UP.format(n=n, c=c)}] for n in range(2, turns + 1)]


class Run:
    def __init__(self, base: str, pid: int, args: argparse.Namespace) -> None:
        self.base, self.pid, self.args = base, pid, args
        host, port = base.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.sent = self.errors = self.conversations = 0
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.next_sample = 0

    def sample(self) -> None:
        row = {
            "requests": self.sent,
            "conversations": self.conversations,
            "rss_mib": round(rss_kib(self.pid) / 1024, 1),
            "elapsed_s": round(time.monotonic() - self.t0, 1),
        }
        self.samples.append(row)
        print(
            f"  {row['requests']:>8,} requests  {row['conversations']:>7,} conversations"
            f"  RSS {row['rss_mib']:>7.1f} MiB  {row['elapsed_s']:>6.1f} s",
            file=sys.stderr,
            flush=True,
        )

    async def worker(self, queue: asyncio.Queue[tuple[int, int]]) -> None:
        client = Client(self.host, self.port)
        try:
            while True:
                try:
                    t, c = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                messages: list[dict[str, str]] = []
                for new in conversation_turns(t, c, self.args.turns):
                    messages += new
                    body = json.dumps({"model": "hermes-bench-model", "messages": messages}).encode()
                    try:
                        status, data = await client.post("/v1/chat/completions", body, f"sk-tenant-{t:05d}")
                    except (OSError, asyncio.IncompleteReadError, ValueError):
                        status, data = 0, b""
                        await client.close()
                    self.sent += 1
                    if status != 200:
                        self.errors += 1
                        break
                    messages.append(json.loads(data)["choices"][0]["message"])
                    if self.sent >= self.next_sample:
                        self.next_sample += self.args.every
                        self.sample()  # blocking for a moment: the other workers wait, which is fine here
                self.conversations += 1
        finally:
            await client.close()

    async def play(self) -> None:
        queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        for c in range(self.args.conversations):  # conversation-major: every tenant is active all along
            for t in range(self.args.tenants):
                queue.put_nowait((t, c))
        self.next_sample = self.args.every
        self.sample()
        await asyncio.gather(*(self.worker(queue) for _ in range(self.args.concurrency)))
        self.sample()


def growth(samples: list[dict[str, Any]]) -> dict[str, float]:
    """RSS growth per 10,000 requests over the first and the last half of the run (after the first sample)."""
    pts = [(s["requests"], s["rss_mib"]) for s in samples if s["requests"] > 0]
    if len(pts) < 3:
        return {}
    mid = pts[len(pts) // 2]

    def slope(a: tuple[int, float], b: tuple[int, float]) -> float:
        return round(10_000 * (b[1] - a[1]) / max(b[0] - a[0], 1), 2)

    return {"first_half_mib_per_10k": slope(pts[0], mid), "last_half_mib_per_10k": slope(mid, pts[-1])}


def render(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    lines = [
        f"memory benchmark: {cfg['tenants']:,} tenants x {cfg['conversations']:,} conversations x {cfg['turns']} turns "
        f"= {doc['requests']:,} requests ({doc['errors']} errors) in {doc['elapsed_s']:.0f} s "
        f"({doc['requests'] / max(doc['elapsed_s'], 1e-9):.0f} req/s, {cfg['concurrency']} connections); "
        f"load average {doc['loadavg_start']} at start, {doc['loadavg_end']} at end",
        "",
    ]
    lines += ["| requests | conversations | RSS MiB | elapsed s |", "|---:|---:|---:|---:|"]
    for s in doc["samples"]:
        lines.append(f"| {s['requests']:,} | {s['conversations']:,} | {s['rss_mib']:.1f} | {s['elapsed_s']:.0f} |")
    if doc.get("roles"):
        lines += ["", "requests by role: " + ", ".join(f"{k} {v:,}" for k, v in doc["roles"].items())]
    g = doc["growth"]
    if g:
        lines += [
            "",
            f"RSS growth per 10,000 requests: first half {g['first_half_mib_per_10k']:+.2f} MiB, "
            f"last half {g['last_half_mib_per_10k']:+.2f} MiB",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--tenants", type=int, default=1_000, help="distinct API keys")
    ap.add_argument("--conversations", type=int, default=100, help="conversations per tenant")
    ap.add_argument("--turns", type=int, default=2, help="requests per conversation")
    ap.add_argument("--concurrency", type=int, default=32, help="keep-alive connections")
    ap.add_argument("--every", type=int, default=10_000, help="sample RSS every N requests")
    ap.add_argument("--smoke", action="store_true", help="20 tenants x 10 conversations x 2 turns")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if args.smoke:
        args.tenants, args.conversations, args.turns, args.every, args.concurrency = 20, 10, 2, 100, 8
    logs = BIN_DIR / "logs-memory"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    doc: dict[str, Any] = {"config": vars(args) | {"smoke": args.smoke}, "loadavg_start": tools.loadavg()}
    up_proc, up = targets.start_upstream(logs)
    try:
        proc, base = start_prefixpin(logs, upstream=up, name="prefixpin")
        try:
            run = Run(base, proc.popen.pid, args)
            asyncio.run(run.play())
            doc["roles"] = roles(base)
        finally:
            proc.stop()
    finally:
        up_proc.stop()
    doc.update(
        requests=run.sent,
        errors=run.errors,
        elapsed_s=round(run.samples[-1]["elapsed_s"], 1),
        samples=run.samples,
        growth=growth(run.samples),
        loadavg_end=tools.loadavg(),
    )
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    if run.errors:
        print(f"bench_memory: {run.errors} requests failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Unavailable as exc:
        raise SystemExit(f"bench_memory: {exc}") from None
