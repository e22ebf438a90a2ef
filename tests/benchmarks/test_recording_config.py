"""The recording target's config (``prefixpin-trace`` in bench_overhead and
bench_paired): to the run's temp dir by default, to the path asked for otherwise,
always rotated as the benchmarks say."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_overhead import TRACE_MAX_BYTES, recording_config
from proxy.config import load


def test_recording_goes_to_the_runs_temp_dir_by_default(tmp_path: Path) -> None:
    trace = json.loads(recording_config(tmp_path).read_text())["trace"]
    assert trace == {"path": str(tmp_path / "trace.jsonl"), "max_bytes": TRACE_MAX_BYTES, "keep": 1}


def test_recording_goes_where_it_is_asked_to(tmp_path: Path) -> None:
    config = load(recording_config(tmp_path, "/dev/null"), env={})
    assert (config.trace.path, config.trace.max_bytes, config.trace.keep) == ("/dev/null", TRACE_MAX_BYTES, 1)
