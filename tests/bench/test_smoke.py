"""Smoke-sized runs of the benchmarks, so a broken benchmark fails CI.

They print their tables; nothing here asserts a time (ratios and times belong in
docs/bench-*.md, measured side by side on a quiet machine).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.infra.procs import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "tests.bench.bench_cache", "--smoke"],
        ["-m", "tests.bench.bench_overhead", "--smoke", "--no-install"],
        ["-m", "tests.bench.bench_provider", "--smoke"],
        ["-m", "tests.bench.bench_bigbody", "--smoke"],
        ["-m", "tests.bench.bench_memory", "--smoke"],
    ],
    ids=["cache", "overhead", "provider", "bigbody", "memory"],
)
def test_benchmark_smoke_run(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=900)
    print(out.stdout[-4000:])
    assert out.returncode == 0, out.stderr[-4000:] + out.stdout[-2000:]
