"""Provider prompt caching with and without prefixpin's ``provider_cache``.

Replays the seeded hermes traces (``benchmarks/traces.py``: the pre-fix agent
and its ideal twin, sessions interleaved by time, review forks included) with
the real ``openai`` and ``anthropic`` SDKs against ``tests/infra/provider.py``
(a scripted provider cache over N machines), directly and through two prefixpin
processes: one with ``provider_cache`` off, one with ``prompt_cache_key:
lineage`` and ``anthropic_breakpoints: auto``.  The Messages runs send the same
conversations converted to Anthropic's shape, with no ``cache_control`` of their
own.  The hit ratio is cached / prompt tokens as the clients saw them.

    python -m benchmarks.bench_provider [--sessions 6 --turns 8 --machines 4] [--smoke] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import yaml

from benchmarks.traces import SMOKE, TraceSpec, generate
from tests.infra.procs import Proc, free_port, start_prefixpin

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--machines", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="one short session (CI)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spec = SMOKE if args.smoke else TraceSpec(sessions=args.sessions, turns=args.turns)
    with tempfile.TemporaryDirectory(prefix="bench-provider-") as tmp:
        rows = run(spec, args.machines, Path(tmp))
    print(json.dumps(rows, indent=1) if args.json else format_table(rows, spec, args.machines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
