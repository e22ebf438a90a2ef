"""Smoke-sized runs of the benchmarks, so a broken benchmark fails CI.

They print their tables; nothing here asserts a time (ratios and times belong in
docs/bench-*.md, measured side by side on a quiet machine).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.infra.procs import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "benchmarks.bench_cache", "--smoke"],
        ["-m", "benchmarks.bench_overhead", "--smoke", "--no-install"],
        ["-m", "benchmarks.bench_overhead", "--smoke", "--targets", "direct,nginx,python-floor,prefixpin-bypass"],
        ["-m", "benchmarks.bench_paired", "--smoke", "--runs", "2"],
        ["-m", "benchmarks.bench_paired", "--smoke", "--without", "proxy.addons.measure:Measure.done"],
        ["-m", "benchmarks.bench_paired", "--smoke", "--bypass"],
        ["-m", "benchmarks.bench_paired", "--smoke", "--env", "PYTHONMALLOC=pymalloc"],
        ["-m", "benchmarks.bench_parts", "--smoke", "proxy.drive:Driver.canonicalize", "proxy.handler:splice"],
        ["-m", "benchmarks.bench_provider", "--smoke"],
        ["-m", "benchmarks.bench_bigbody", "--smoke"],
        ["-m", "benchmarks.bench_bigbody", "--smoke", "--shape", "dates"],
        ["-m", "benchmarks.bench_memory", "--smoke"],
        ["-m", "benchmarks.bench_inprocess", "--requests", "64", "--conversations", "8", "--turns", "3"],
        ["-m", "benchmarks.bench_inprocess", "--requests", "64", "--conversations", "8", "--evict", "0,1"],
        [
            "-m",
            "benchmarks.bench_inprocess",
            "--requests",
            "64",
            "--conversations",
            "8",
            "--evict",
            "1",
            "--compare-ref",
            "HEAD",
            "--compare-ref",
            "HEAD",
            "--rounds",
            "2",
        ],
        ["-m", "benchmarks.bench_inprocess", "--requests", "64", "--conversations", "8", "--stages"],
        ["-m", "benchmarks.bench_inprocess", "--requests", "64", "--conversations", "8", "--gc"],
        ["-m", "benchmarks.bench_http", "--smoke"],
        ["-m", "benchmarks.bench_store", "--smoke"],
        ["-m", "benchmarks.bench_agents", "--cost", "--repeat", "1"],
        ["-m", "benchmarks.bench_learning", "--repeat", "1"],
        ["-m", "benchmarks.bench_instructions", "--smoke", "--branches", "--caches"],
        ["-m", "benchmarks.bench_opcodes", "--smoke", "--sessions", "1"],
        ["-m", "benchmarks.bench_perf", "--smoke"],
    ],
    ids=[
        "cache",
        "overhead",
        "overhead-floor",
        "paired",
        "paired-without",
        "paired-bypass",
        "paired-env",
        "parts",
        "provider",
        "bigbody",
        "bigbody-dates",
        "memory",
        "inprocess",
        "inprocess-evict",
        "inprocess-evict-ref",
        "inprocess-stages",
        "inprocess-gc",
        "http",
        "store",
        "agents-cost",
        "learning",
        "instructions",
        "opcodes",
        "perf",
    ],
)
def test_benchmark_smoke_run(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=900)
    print(out.stdout[-4000:])
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]


def test_affinity_benchmark_smoke_run() -> None:
    """Every contender ran; nothing was lost but what was in flight on the killed replica."""
    argv = [sys.executable, "-m", "benchmarks.bench_affinity", "--smoke", "--json"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]
    report = json.loads(out.stdout)
    runs = report["runs"]
    assert set(runs) == {"a-ideal-direct", "a-prefixpin-slots", "b-round-robin", "b-lineage", "c-lineage-kill"}
    requests = {r["requests"] for r in runs.values()}
    assert len(requests) == 1 and requests.pop() > 0  # the same trace for each
    for name, r in runs.items():
        assert r["prompt_tokens"] > 0, name
        if r["part"] != "c":
            assert r["lost"] == 0, (name, r["errors"])
    kill = runs["c-lineage-kill"]["kill"]
    assert kill["replica"] in (0, 1) and kill["requests_after_kill"] > 0
    assert kill["lost_sent_after_kill"] == 0, runs["c-lineage-kill"]["errors"]
    assert runs["b-lineage"]["sessions_on_one_replica"] is not None
