"""Provider prompt caching with and without prefixpin's ``provider_cache``.

Part ``ratio``: replays the seeded hermes traces (``benchmarks/traces.py``: the
pre-fix agent and its ideal twin, sessions interleaved by time, review forks
included) with the real ``openai`` and ``anthropic`` SDKs against
``tests/infra/provider.py`` (a scripted provider cache over N machines), directly
and through two prefixpin processes: one with ``provider_cache`` off, one with
``prompt_cache_key: lineage`` and ``anthropic_breakpoints: auto``.  The Messages
runs send the same conversations converted to Anthropic's shape, with no
``cache_control`` of their own.  The hit ratio is cached / prompt tokens as the
clients saw them.

Part ``ttl``: the pre-fix trace's Messages conversations with a person's pauses
between turns (the agent's own tool loop and forks keep their seconds), replayed
as Messages requests through prefixpin (``anthropic_breakpoints: auto``,
``anthropic_ttl`` 5m, 1h and auto) to the scripted provider cache, whose entries
expire at their TTL.  Time is simulated: one clock, set to each line's ``t``
before it is sent, is both the provider's and prefixpin's (``create_app(clock=)``;
both in this process, the provider behind an httpx transport), so hours of
pauses replay in seconds.  Dollars are the usage the client saw at Claude
Sonnet-like prices (:data:`PRICE`); prefixpin's own ``prefixpin_saved_usd_total``
is read back as a check.

Part ``breakpoints``: sessions of one agent with a fixed ~9k-token developer prefix
(the public report's shape: only the user messages differ) and a few turns each,
as chat completions for a GPT-5.6 model, which reuses a cached prefix only where a
breakpoint was written: through prefixpin with ``openai_breakpoints`` off and
``auto`` to the scripted provider cache (in this process, one machine).  Dollars at
GPT-5.6-like prices (:data:`GPT_PRICE`, writes at 1.25x input).

    python -m benchmarks.bench_provider [--part ratio|ttl|breakpoints|all] [--sessions 6 --turns 8 --machines 4]
                                         [--smoke] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import yaml
from starlette.testclient import TestClient

from benchmarks.traces import SMOKE, TraceSpec, generate
from proxy.app import create_app
from proxy.config import load
from tests.infra.procs import Proc, free_port, start_prefixpin
from tests.infra.provider import ManualClock, Provider, Rejected

Json = Any
ON = {"provider_cache": {"prompt_cache_key": "lineage", "anthropic_breakpoints": "auto"}}
OFF: dict[str, Any] = {"provider_cache": {"prompt_cache_key": "off", "anthropic_breakpoints": "off"}}


@dataclass
class Bench:
    provider: str
    off: str
    on: str


@contextlib.contextmanager
def servers(log_dir: Path, machines: int) -> Iterator[Bench]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.infra.provider", "--port", str(port), "--machines", str(machines)]
    provider = Proc("provider", argv, log_dir)
    base = f"http://127.0.0.1:{port}"
    procs = [provider]
    try:
        provider.wait_http(base + "/health")
        bases = []
        for name, cfg in (("off", OFF), ("on", ON)):
            path = log_dir / f"prefixpin-{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            proc, url = start_prefixpin(log_dir, upstream=base, config=path, name=f"prefixpin-{name}")
            procs.append(proc)
            bases.append(url)
        yield Bench(base, bases[0], bases[1])
    finally:
        for proc in procs:
            proc.stop()


def to_anthropic(body: Json) -> Json:
    """A chat-completions request as the same conversation in Messages' shape."""
    msgs = body["messages"]
    out: list[Json] = []
    for m in msgs[1:]:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks: list[Json] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for c in m["tool_calls"]:
                f = c["function"]
                blocks.append(
                    {"type": "tool_use", "id": c["id"], "name": f["name"], "input": json.loads(f["arguments"])}
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"]["parameters"],
        }
        for t in body.get("tools") or []
    ]
    return {"model": "claude-bench", "max_tokens": 8, "system": msgs[0]["content"], "tools": tools, "messages": out}


def replay(lines: list[Json], api: str, base: str, tenant: str) -> dict[str, float]:
    """Send every line with the API's SDK; cached / prompt tokens as the client saw them."""
    prompt = cached = 0
    if api == "chat":
        with openai.OpenAI(base_url=base + "/v1", api_key=tenant, max_retries=0, timeout=60) as client:
            for line in lines:
                body = {**line["body"], "stream": False}
                usage = client.chat.completions.create(**body).usage
                assert usage is not None
                prompt += usage.prompt_tokens
                details = usage.prompt_tokens_details
                cached += (details.cached_tokens or 0) if details is not None else 0
    else:
        with anthropic.Anthropic(base_url=base, api_key=tenant, max_retries=0, timeout=60) as aclient:
            for line in lines:
                u = aclient.messages.create(**to_anthropic(line["body"])).usage
                read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
                prompt += u.input_tokens + read + write
                cached += read
    return {"requests": len(lines), "prompt": prompt, "cached": cached, "ratio": cached / prompt if prompt else 0.0}


def run(spec: TraceSpec, machines: int, log_dir: Path) -> list[Json]:
    pre, ideal = generate(spec)
    rows = []
    with servers(log_dir, machines) as b, httpx.Client(trust_env=False) as http:
        for trace, lines in (("pre-fix", pre), ("ideal", ideal)):
            lines = sorted(lines, key=lambda x: x["t"])
            for api, routes in (
                ("chat", (("direct", b.provider), ("prefixpin, off", b.off), ("prefixpin, lineage key", b.on))),
                ("messages", (("direct", b.provider), ("prefixpin, off", b.off), ("prefixpin, breakpoints", b.on))),
            ):
                for route, base in routes:
                    http.post(b.provider + "/_reset").raise_for_status()
                    tenant = f"sk-bench-{trace}-{api}-{route}"
                    rows.append({"trace": trace, "api": api, "route": route, **replay(lines, api, base, tenant)})
    return rows


def format_table(rows: list[Json], spec: TraceSpec, machines: int) -> str:
    head = (
        f"sessions={spec.sessions} turns={spec.turns} fork_every={spec.fork_every} seed={spec.seed} "
        f"machines={machines}\n\n"
        "| trace | API | route | requests | prompt tokens | cached tokens | hit ratio |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['trace']} | {r['api']} | {r['route']} | {r['requests']} | {r['prompt']} | {r['cached']} | "
        f"{100 * r['ratio']:.1f}% |\n"
        for r in rows
    )
    return head + body


# -- part ttl: a person's pauses, simulated time -----------------------------------------
MODEL = "claude-bench"
PRICE = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}  # USD / 1M tokens
WRITE_1H = 2 * PRICE["input"]
MINUTE = 60.0
# Seconds between a session's turns (a reply read, the next message typed), by profile.
PROFILES: dict[str, tuple[tuple[float, float, float], ...]] = {  # (share, low, high)
    "quick": ((1.0, 0.3 * MINUTE, 4 * MINUTE),),
    "reading": ((1.0, 6 * MINUTE, 45 * MINUTE),),
    "mixed": ((0.4, 0.3 * MINUTE, 4 * MINUTE), (0.4, 6 * MINUTE, 45 * MINUTE), (0.2, 70 * MINUTE, 180 * MINUTE)),
    "away": ((1.0, 70 * MINUTE, 180 * MINUTE),),
}
MODES = ("5m", "1h", "auto")


def with_pauses(lines: list[Json], profile: str, seed: int) -> list[Json]:
    """``lines`` (sorted by ``t``) with a pause drawn from ``profile`` before each
    session's next turn; the seconds within a turn (tool loop, forks) kept."""
    rng = random.Random(f"{profile}-{seed}")
    out: list[Json] = []
    shift = 0.0
    last: dict[Any, Any] = {}
    for line in lines:
        session, turn = line["session"], line["turn"]
        if session in last and turn != last[session]:
            shift += _pause(rng, PROFILES[profile])
        last[session] = turn
        out.append({**line, "t": line["t"] + shift})
    return out


def _pause(rng: random.Random, mix: tuple[tuple[float, float, float], ...]) -> float:
    """Seconds drawn from ``mix``: (share, low, high) ranges, one picked by its share."""
    pick = rng.random()
    for share, low, high in mix:
        pick -= share
        if pick <= 0:
            return rng.uniform(low, high)
    return rng.uniform(mix[-1][1], mix[-1][2])


def replay_ttl(lines: list[Json], mode: str | None) -> dict[str, Any]:
    """Every line through prefixpin (``anthropic_ttl: mode``; None: straight to the
    provider, no breakpoints) on one simulated clock; tokens and dollars as the client saw them."""
    clock = ManualClock()
    provider = Provider(machines=1, clock=clock)

    def upstream(request: httpx.Request) -> httpx.Response:
        try:
            return httpx.Response(200, json=provider.messages(orjson.loads(request.content), dict(request.headers)))
        except Rejected as exc:
            return httpx.Response(400, json={"type": "error", "error": {"message": str(exc)}})

    pc: dict[str, Any] = {"prices": {MODEL: PRICE}}
    if mode is not None:
        pc.update(anthropic_breakpoints="auto", anthropic_ttl=mode)
    config = load(None, env={}, overrides={f"provider_cache.{k}": v for k, v in pc.items()})
    totals = dict.fromkeys(("prompt", "input", "read", "write_5m", "write_1h", "output"), 0)
    saved = 0.0
    http: httpx.Client | TestClient
    if mode is None:
        http = httpx.Client(transport=httpx.MockTransport(upstream), base_url="http://provider")
    else:
        http = TestClient(create_app(config, transport=httpx.MockTransport(upstream), clock=clock))
    with http:
        for line in lines:
            clock.now = line["t"]
            body = {**to_anthropic(line["body"]), "model": MODEL}
            r = http.post("/v1/messages", json=body, headers={"x-api-key": "sk-bench-ttl"})
            r.raise_for_status()
            u = r.json()["usage"]
            long = (u.get("cache_creation") or {}).get("ephemeral_1h_input_tokens", 0)
            write, read = u["cache_creation_input_tokens"], u["cache_read_input_tokens"]
            totals["prompt"] += u["input_tokens"] + read + write
            totals["input"] += u["input_tokens"]
            totals["read"] += read
            totals["write_5m"] += write - long
            totals["write_1h"] += long
            totals["output"] += u["output_tokens"]
        if mode is not None:
            text = http.get("/metrics").text
            saved = sum(
                float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("prefixpin_saved_usd_total{")
            )
    usd = (
        totals["input"] * PRICE["input"]
        + totals["read"] * PRICE["cached_input"]
        + totals["write_5m"] * PRICE["cache_write"]
        + totals["write_1h"] * WRITE_1H
        + totals["output"] * PRICE["output"]
    ) / 1e6
    uncached = (totals["prompt"] * PRICE["input"] + totals["output"] * PRICE["output"]) / 1e6
    return {
        "requests": len(lines),
        **totals,
        "ratio": totals["read"] / totals["prompt"] if totals["prompt"] else 0.0,
        "usd": usd,
        "usd_uncached": uncached,
        "prefixpin_saved_usd": saved,
    }


def run_ttl(spec: TraceSpec, profiles: tuple[str, ...] = tuple(PROFILES)) -> list[Json]:
    pre, _ = generate(spec)
    lines = sorted(pre, key=lambda x: x["t"])
    rows = []
    for profile in profiles:
        paused = with_pauses(lines, profile, spec.seed)
        for mode in (None, *MODES):
            r = replay_ttl(paused, mode)
            rows.append({"profile": profile, "ttl": mode or "direct (no breakpoints)", **r})
    return rows


def format_ttl(rows: list[Json], spec: TraceSpec) -> str:
    head = (
        f"sessions={spec.sessions} turns={spec.turns} fork_every={spec.fork_every} seed={spec.seed}; "
        f"USD per 1M tokens: input {PRICE['input']}, cached {PRICE['cached_input']}, "
        f"5m write {PRICE['cache_write']}, 1h write {WRITE_1H}, output {PRICE['output']}\n\n"
        "| pauses | anthropic_ttl | requests | prompt tokens | read | written 5m | written 1h | hit ratio "
        "| cost USD | saved USD (prefixpin_saved_usd_total) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['profile']} | {r['ttl']} | {r['requests']} | {r['prompt']} | {r['read']} | {r['write_5m']} | "
        f"{r['write_1h']} | {100 * r['ratio']:.1f}% | {r['usd']:.4f} | "
        f"{r['usd_uncached'] - r['usd']:.4f} ({r['prefixpin_saved_usd']:.4f}) |\n"
        for r in rows
    )
    return head + body


# -- part breakpoints: OpenAI GPT-5.6 and later ---------------------------------------------
GPT_MODEL = "gpt-5.6"
GPT_PRICE = {"input": 2.0, "cached_input": 0.2, "cache_write": 2.5, "output": 8.0}  # USD / 1M tokens
DEVELOPER = "Follow the repository's conventions; run the tests before you answer; keep diffs small. " * 400


def replay_breakpoints(sessions: int, turns: int, mode: str) -> dict[str, Any]:
    """``sessions`` conversations of ``turns`` turns through prefixpin (``openai_breakpoints: mode``)."""
    provider = Provider(machines=1)

    def upstream(request: httpx.Request) -> httpx.Response:
        try:
            return httpx.Response(200, json=provider.chat(orjson.loads(request.content)))
        except Rejected as exc:
            return httpx.Response(400, json={"error": {"message": str(exc)}})

    pc = {"openai_breakpoints": mode, "prices": {GPT_MODEL: GPT_PRICE}}
    config = load(None, env={}, overrides={f"provider_cache.{k}": v for k, v in pc.items()})
    totals = dict.fromkeys(("prompt", "read", "write", "output"), 0)
    with TestClient(create_app(config, transport=httpx.MockTransport(upstream))) as http:
        for s in range(sessions):
            messages: list[Json] = [{"role": "developer", "content": DEVELOPER}]
            for t in range(turns):
                messages.append({"role": "user", "content": f"Session {s}, turn {t}: the next failing test."})
                r = http.post("/v1/chat/completions", json={"model": GPT_MODEL, "messages": messages})
                r.raise_for_status()
                u = r.json()["usage"]
                details = u["prompt_tokens_details"]
                totals["prompt"] += u["prompt_tokens"]
                totals["read"] += details["cached_tokens"]
                totals["write"] += details["cache_write_tokens"]
                totals["output"] += u["completion_tokens"]
                messages.append(r.json()["choices"][0]["message"])
        text = http.get("/metrics").text
    saved = sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("prefixpin_saved_usd_total{"))
    plain = totals["prompt"] - totals["read"] - totals["write"]
    usd = (
        plain * GPT_PRICE["input"]
        + totals["read"] * GPT_PRICE["cached_input"]
        + totals["write"] * GPT_PRICE["cache_write"]
        + totals["output"] * GPT_PRICE["output"]
    ) / 1e6
    return {
        "requests": sessions * turns,
        **totals,
        "ratio": totals["read"] / totals["prompt"] if totals["prompt"] else 0.0,
        "usd": usd,
        "prefixpin_saved_usd": saved,
    }


def run_breakpoints(sessions: int, turns: int) -> list[Json]:
    return [{"openai_breakpoints": mode, **replay_breakpoints(sessions, turns, mode)} for mode in ("off", "auto")]


def format_breakpoints(rows: list[Json], sessions: int, turns: int) -> str:
    head = (
        f"sessions={sessions} turns={turns} model={GPT_MODEL}; USD per 1M tokens: input {GPT_PRICE['input']}, "
        f"cached {GPT_PRICE['cached_input']}, write {GPT_PRICE['cache_write']}, output {GPT_PRICE['output']}\n\n"
        "| openai_breakpoints | requests | prompt tokens | read | written | hit ratio | cost USD "
        "| prefixpin_saved_usd_total |\n|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['openai_breakpoints']} | {r['requests']} | {r['prompt']} | {r['read']} | {r['write']} | "
        f"{100 * r['ratio']:.1f}% | {r['usd']:.4f} | {r['prefixpin_saved_usd']:.4f} |\n"
        for r in rows
    )
    return head + body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("ratio", "ttl", "breakpoints", "all"), default="all")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--machines", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="one short session (CI)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spec = SMOKE if args.smoke else TraceSpec(sessions=args.sessions, turns=args.turns)
    report: dict[str, Any] = {}
    if args.part in ("ratio", "all"):
        with tempfile.TemporaryDirectory(prefix="bench-provider-") as tmp:
            report["ratio"] = run(spec, args.machines, Path(tmp))
    if args.part in ("ttl", "all"):
        report["ttl"] = run_ttl(spec)
    if args.part in ("breakpoints", "all"):
        report["breakpoints"] = run_breakpoints(spec.sessions, min(spec.turns, 4))
    if args.json:
        print(json.dumps(report if len(report) > 1 else next(iter(report.values())), indent=1))
    else:
        if "ratio" in report:
            print(format_table(report["ratio"], spec, args.machines))
        if "ttl" in report:
            print(format_ttl(report["ttl"], spec))
        if "breakpoints" in report:
            print(format_breakpoints(report["breakpoints"], spec.sessions, min(spec.turns, 4)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
