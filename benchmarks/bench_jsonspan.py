"""Micro-benchmark of canonicalize.jsonspan on realistic hermes bodies (no assertions on time).

Each case builds a fresh JsonDoc (nothing cached between runs, as on a request)
and is timed call by call; the table gives the median and p90 in microseconds.
Bodies: the load generator's compact hermes templates (``ensure_ascii=False``,
what the openai SDK sends) and one ``json.dumps`` default body (``", "``
separators, every non-ASCII character escaped as ``\\uXXXX``).

    python -m benchmarks.bench_jsonspan            # 3000 runs per case
    python -m benchmarks.bench_jsonspan --runs 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import orjson

from benchmarks.overhead.body import MINUTE, SEQ, hermes_body, templates
from canonicalize.jsonspan import Edits, JsonDoc

TARGETS_US = {"span messages[0].content": 15.0, "span tools": 80.0, "edits round": 100.0}


def _bodies() -> dict[str, bytes]:
    compact = [t.replace(SEQ, "7").replace(MINUTE, "31").encode() for t in templates(stream=True)]
    dumped = json.dumps(hermes_body(0, 44) | {"stream": True}).encode()
    return {
        f"hermes s0 compact {len(compact[0]) // 1000} KB": compact[0],
        f"hermes s3 compact {len(compact[3]) // 1000} KB": compact[3],
        f"hermes s0 json.dumps {len(dumped) // 1000} KB": dumped,
    }


def _cases(raw: bytes) -> dict[str, Callable[[], object]]:
    new_system = orjson.loads(raw)["messages"][0]["content"].replace("02:31 PM", "02:00 PM")

    def round_trip() -> bytes:
        edits = Edits(JsonDoc(raw))
        edits.replace_string(("messages", 0, "content"), new_system)
        edits.set_member((), "stream_options", b'{"include_usage":true}')
        return edits.apply()

    return {
        "span messages[0].content": lambda: JsonDoc(raw).span(("messages", 0, "content")),
        "span tools": lambda: JsonDoc(raw).span(("tools",)),
        "span messages[-1].content": lambda: JsonDoc(raw).span(("messages", -1, "content")),
        "edits round": round_trip,
        "members(()) (full top level)": lambda: JsonDoc(raw).members(()),
        "orjson.loads (reference)": lambda: orjson.loads(raw),
    }


def _time(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    for _ in range(min(runs, 200)):  # warm up
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.9)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    print(f"{'body':28} {'case':30} {'median µs':>10} {'p90 µs':>9} {'target':>7}")
    for body, raw in _bodies().items():
        for case, fn in _cases(raw).items():
            median, p90 = _time(fn, args.runs)
            target = TARGETS_US.get(case)
            print(f"{body:28} {case:30} {median:10.1f} {p90:9.1f} {'' if target is None else f'<{target:g}':>7}")


if __name__ == "__main__":
    main()
