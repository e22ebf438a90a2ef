"""Real agents no pack knows: the cached share of their prompts direct, through
prefixpin with ``learn: pin``, and ideal.

Each captured trace (tests/agents/data/<agent>.jsonl.gz, see tests/agents/capture.py:
two sessions of one tenant, several invocations each, a change of day) is run
through prefixpin's core as the proxy drives it (``proxy.offline``: the request
machine on a memory store, each request's reply recorded as the upstream gave it), and every
request's prompt is rendered the way a chat template lays it out (system, tools,
then each message's role and text).  The cached share is predicted from prefix
bytes: a request's cached bytes are the longest prefix it shares with any prompt
sent before it (an engine that keeps every prompt it saw); the share is their
sum over the prompts' sum.

- ``direct``: the trace as the agent sent it;
- ``pin``: as prefixpin forwards it with ``canonicalize.learn: pin``;
- ``ideal``: every request that continues its thread (same session, same system
  prompt: the agent's main loop, or its side requests) hits its previous request's
  whole prompt; a thread's first request as direct.

With ``--cost``, the CPU time each request takes through that flow with ``learn:
off``, ``suggest`` and ``pin`` instead (this thread's time, so other jobs on a
shared machine do not count; each trace sent ``--repeat`` times to a fresh store,
the median kept).

    python3 -m benchmarks.bench_agents [--agent qwen-code] [--json] [--cost [--repeat 20]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from canonicalize import Settings, match
from proxy.config import load
from proxy.offline import Offline
from tests.agents.capture import AGENTS, DATA
from tests.agents.capture import load as load_trace

Json = dict[str, Any]


@dataclass(frozen=True)
class Figures:
    agent: str
    requests: int
    prompt_bytes: int
    direct: float
    pin: float
    ideal: float
    rewrites: dict[str, int]
    roles: dict[str, int]


def render(body: Json) -> bytes:
    """A prompt as a chat template lays it out: system texts, tools[], then each message."""
    out: list[bytes] = []
    messages = body.get("messages") or []
    for m in messages:
        if m.get("role") in ("system", "developer"):
            out.append(b"<|system|>" + _text(m.get("content")).encode())
    if body.get("tools"):
        out.append(b"<|tools|>" + orjson.dumps(body["tools"]))
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        piece = f"<|{m.get('role')}|>" + _text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            piece += f"<|call|>{fn.get('name')}({fn.get('arguments')})"
        out.append(piece.encode())
    return b"\n".join(out)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _common(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest equal prefix, by halving (C memcmp per step)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cached(prompts: Sequence[bytes]) -> list[int]:
    """Each prompt's cached bytes: the longest prefix it shares with a prompt before it."""
    return [max((_common(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


def ideal(lines: Sequence[Json], prompts: Sequence[bytes], direct: Sequence[int]) -> list[int]:
    """Each continuation of its thread hits its previous request's whole prompt."""
    last: dict[tuple[str, str], int] = {}
    out = []
    for i, line in enumerate(lines):
        thread = (line["session"], _text(line["body"]["messages"][0].get("content"))[:200])
        j = last.get(thread)
        out.append(max(direct[i], min(len(prompts[j]), len(prompts[i]))) if j is not None else direct[i])
        last[thread] = i
    return out


async def through(lines: Sequence[Json], mode: str) -> list[Any]:
    """The flows of ``lines`` through prefixpin's request flow with ``learn: mode``."""
    offline = Offline(load(None, env={}), settings=Settings(learn=mode))  # type: ignore[arg-type]
    flows = []
    for line in lines:
        exchange = match(line["path"])
        assert exchange is not None
        reply = line.get("response")
        flows.append(await offline.send(line["body"], exchange=exchange, headers=line["headers"], reply=reply))
    return flows


async def _spent(lines: Sequence[Json], mode: str) -> float:
    """CPU seconds (this thread's) ``lines`` take through the flow with ``learn: mode``,
    the flow built (rules compiled, store empty) before the clock starts."""
    offline = Offline(load(None, env={}), settings=Settings(learn=mode))  # type: ignore[arg-type]
    sends = [(line["body"], match(line["path"]), line["headers"], line.get("response")) for line in lines]
    t0 = time.thread_time()
    for body, exchange, headers, reply in sends:
        assert exchange is not None
        await offline.send(body, exchange=exchange, headers=headers, reply=reply)
    return time.thread_time() - t0


def cost(lines: Sequence[Json], repeat: int) -> dict[str, float]:
    """Median CPU µs per request of ``lines`` with each ``learn`` mode."""
    out = {}
    for mode in ("off", "suggest", "pin"):
        runs = [asyncio.run(_spent(lines, mode)) for _ in range(repeat)]
        out[mode] = round(1e6 * statistics.median(runs) / len(lines), 1)
    return out


def measure(agent: str, lines: Sequence[Json]) -> Figures:
    sent = [render(line["body"]) for line in lines]
    flows = asyncio.run(through(lines, "pin"))
    forwarded = [render(orjson.loads(f.out)) for f in flows]
    direct, pinned = cached(sent), cached(forwarded)
    best = ideal(lines, sent, direct)
    total = sum(len(p) for p in sent)
    rewrites: dict[str, int] = {}
    roles: dict[str, int] = {}
    for f in flows:
        roles[f.role] = roles.get(f.role, 0) + 1
        for name in f.rewrites:
            rewrites[name] = rewrites.get(name, 0) + 1
    return Figures(
        agent,
        len(lines),
        total,
        round(sum(direct) / total, 4),
        round(sum(pinned) / sum(len(p) for p in forwarded), 4),
        round(sum(best) / total, 4),
        rewrites,
        roles,
    )


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", choices=sorted(AGENTS), action="append")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cost", action="store_true", help="CPU per request with learn off, suggest and pin")
    ap.add_argument("--repeat", type=int, default=20, help="--cost: runs of each trace per mode")
    args = ap.parse_args(argv)
    if args.cost:
        return _print_cost(args)
    figures = [measure(name, load_trace(name, args.data)) for name in args.agent or sorted(AGENTS)]
    if args.json:
        print(json.dumps({"commit": _commit(), "agents": [asdict(f) for f in figures]}, indent=2))
        return 0
    print(f"{'agent':<10} {'requests':>8} {'prompt KB':>9} {'direct':>7} {'pin':>7} {'ideal':>7}  rewrites")
    for f in figures:
        names = ", ".join(f"{k} x{v}" for k, v in sorted(f.rewrites.items())) or "-"
        print(
            f"{f.agent:<10} {f.requests:>8} {f.prompt_bytes / 1024:>9.0f} "
            f"{f.direct:>7.1%} {f.pin:>7.1%} {f.ideal:>7.1%}  {names}"
        )
    return 0


def _print_cost(args: argparse.Namespace) -> int:
    requests: dict[str, int] = {}
    spent: dict[str, dict[str, float]] = {}
    for name in args.agent or sorted(AGENTS):
        lines = load_trace(name, args.data)
        requests[name], spent[name] = len(lines), cost(lines, args.repeat)
    if args.json:
        rows = {name: {"requests": requests[name], "us_per_request": spent[name]} for name in spent}
        print(json.dumps({"commit": _commit(), "repeat": args.repeat, "agents": rows}, indent=2))
        return 0
    print(f"CPU µs per request, median of {args.repeat} runs")
    print(f"{'agent':<10} {'requests':>8} {'off':>8} {'suggest':>8} {'pin':>8} {'+suggest':>9} {'+pin':>8}")
    for name, us in spent.items():
        print(
            f"{name:<10} {requests[name]:>8} {us['off']:>8.0f} {us['suggest']:>8.0f} {us['pin']:>8.0f} "
            f"{us['suggest'] - us['off']:>+9.0f} {us['pin'] - us['off']:>+8.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
