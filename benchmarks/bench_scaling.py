"""How prefixpin's per-request cost grows with the conversation's length.

    python -m benchmarks.bench_scaling [--messages 10,100,300,1000] [--json]

Times the in-process request path on hermes-style bodies (benchmarks/overhead/
body.py) of 10 to 1000 history messages, the same system prompt and tools[]:

    root          orjson.loads -> prepare -> classify / finalize against an empty
                  Lookup -> the edits spliced into the bytes (a first request)
    continuation  the previous turn (this conversation up to its last tool result)
                  was recorded, with its reply, in a MemoryStore; this request goes
                  through the proxy's own request hooks (``proxy.offline``: the
                  addons, store lookup, classify, finalize: pins restored), its
                  edits are spliced, and it is recorded in turn by the Record
                  addon (``record`` column)

Each figure is the median of many samples of the thread's CPU time
(``time.thread_time``: on a machine shared with other jobs, wall time would
count the time others had the core).  The store is
the proxy's own MemoryStore; its coroutines never suspend, so they are driven
with ``coro.send(None)``, as cheap as awaiting them inside the proxy's loop.
The cost must stay linear: the marginal cost per extra message (between two
rows) should not grow with the length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson
from starlette.datastructures import Headers

from benchmarks.overhead.body import hermes_body
from canonicalize import CHAT, Canonicalized, Canonicalizer, JsonDoc, Lookup, Request, analysis, render
from proxy.config import load
from proxy.offline import Offline
from proxy.tenancy import tenant_of

T = TypeVar("T")
KEY = {"authorization": "Bearer sk-bench"}
REPLY = {"role": "assistant", "content": "Done: the export rewinds its buffer now and the suite passes."}


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends (the memory store's) to its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("the coroutine suspended; it needs an event loop")


def median_us(fn: Callable[[], object], budget_s: float, min_n: int = 15) -> tuple[float, int]:
    """Median of per-call times (µs) over ``budget_s`` seconds or ``min_n`` calls, whichever is more."""
    for _ in range(3):  # warm-up
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < min_n or time.perf_counter() < deadline:
        t0 = time.thread_time()
        fn()
        samples.append(time.thread_time() - t0)
    return statistics.median(samples) * 1e6, len(samples)


class Case:
    """One conversation length: the previous turn's body, and this turn's body."""

    def __init__(self, canon: Canonicalizer, n: int) -> None:
        self.canon = canon
        self.n = n
        # This turn: n history messages + a new user message.  The previous turn is the
        # same conversation up to the last tool result; its reply (the assistant's answer,
        # recorded as a link) is what this turn replays before its new question.
        body = hermes_body(0, n, user="Now add a test for the empty inventory case.", minute="31")
        prev = {**body, "messages": [hermes_body(0, n, minute="30")["messages"][0], *body["messages"][1:-2]]}
        self.reply = body["messages"][-2]
        self.raw = orjson.dumps(body)
        self.prev_raw = orjson.dumps(prev)
        self.messages = len(body["messages"])

    def root(self) -> bytes:
        """A new conversation: the core's machine with a store that holds nothing."""
        machine = self.canon.start(Request(self.raw, CHAT, TENANT, HEADERS, "x", remember=False))
        need = machine.send()
        while need is not None:
            need = machine.send(Lookup())
        done = machine.result
        assert done is not None
        return render(done.doc, done.ops)

    def seeded(self) -> Offline:
        """The proxy's offline flow holding the previous turn as it records it (request + reply link)."""
        offline = Offline(load(None, env={}), new_id=lambda: "prev")
        asyncio.run(offline.send(self.prev_raw, reply=self.reply, headers=KEY))  # recording needs a loop
        return offline

    def continuation(self, offline: Offline) -> tuple[Canonicalized, bytes]:
        """The next turn through the proxy's driver of the core: its outcome and bytes."""
        done = run_sync(offline.driver.canonicalize(self.raw, CHAT, TENANT, HEADERS, remember=True, big=False))
        assert done is not None
        return done, render(done.doc, done.ops) if done.ops else self.raw


HEADERS = Headers(KEY)
TENANT = tenant_of(HEADERS.raw, b"", load(None, env={}).tenancy)


def measure(n: int, budget_s: float) -> dict[str, Any]:
    offline = Offline(load(None, env={}))
    canon: Canonicalizer = offline.s.canon
    case = Case(canon, n)
    seeded = case.seeded()
    role = case.continuation(seeded)[0].role
    parts = {
        "parse": lambda: orjson.loads(case.raw),
        "prepare": lambda: analysis.prepare(canon.rules, canon.memos, JsonDoc(case.raw), orjson.loads(case.raw), CHAT),
        "root": case.root,
        "continuation": lambda: case.continuation(seeded),
    }
    out: dict[str, Any] = {"messages": case.messages, "body_kb": round(len(case.raw) / 1024, 1), "role": role}
    for name, fn in parts.items():
        out[f"{name}_us"], out[f"{name}_n"] = median_us(fn, budget_s)
    done, sent = case.continuation(seeded)
    assert done.outcome is not None
    rec = done.outcome.record

    def record() -> None:
        run_sync(seeded.driver.record(TENANT, done, sent, REPLY, rec, big=False))

    out["record_us"], out["record_n"] = median_us(record, budget_s / 2)
    for key in ("parse_us", "prepare_us", "root_us", "continuation_us", "record_us"):
        out[key] = round(out[key], 1)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| messages | body KB | parse µs | prepare µs | root µs/req | continuation µs/req | record µs | "
        "continuation µs/msg | marginal µs per extra msg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    prev: dict[str, Any] | None = None
    for r in rows:
        cont_total = r["continuation_us"] + r["record_us"]
        marginal = "-"
        if prev is not None:
            prev_total = prev["continuation_us"] + prev["record_us"]
            marginal = f"{(cont_total - prev_total) / (r['messages'] - prev['messages']):.2f}"
        lines.append(
            f"| {r['messages']} | {r['body_kb']:.0f} | {r['parse_us']:,.0f} | {r['prepare_us']:,.0f} | "
            f"{r['root_us']:,.0f} | {r['continuation_us']:,.0f} | {r['record_us']:,.0f} | "
            f"{cont_total / r['messages']:.2f} | {marginal} |"
        )
        prev = r
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", default="10,100,300,1000", help="history lengths to time")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds of sampling per figure")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [measure(int(n), args.budget) for n in args.messages.split(",") if n.strip()]
    bad = [r for r in rows if r["role"] != "continuation"]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("prefixpin request path vs conversation length (median per request; hermes-style body)\n")
        print(table(rows))
        first, last = rows[0], rows[-1]
        if len(rows) > 1:
            growth = (last["continuation_us"] + last["record_us"]) / (first["continuation_us"] + first["record_us"])
            print(
                f"\n{last['messages']} vs {first['messages']} messages: {last['messages'] / first['messages']:.0f}x "
                f"the messages, {growth:.1f}x the time (continuation + record)."
            )
    if bad:
        print(f"warning: not classified as continuation: {[(r['messages'], r['role']) for r in bad]}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
