"""``bench_paired --without``: its specs, and ``without/sitecustomize.py`` replacing the
named functions in a fresh interpreter (a function, a method, an ``async def``), and
saying which names were not there."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_paired
from tests.infra.procs import REPO


def test_specs() -> None:
    assert bench_paired.without_spec("proxy.addons.measure:Measure.done") == (
        "proxy.addons.measure",
        "Measure.done",
        None,
    )
    assert bench_paired.without_spec("proxy.store.memory:MemoryStore._owners=([], [])") == (
        "proxy.store.memory",
        "MemoryStore._owners",
        ([], []),
    )
    for bad in ("proxy.addons.measure", ":done", "m:", "m:f=not a literal"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_paired.without_spec(bad)


def test_without_and_compare_ref_do_not_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_paired.main(["--without", "m:f", "--compare-ref", "HEAD"])
    assert "not with --compare-ref" in capsys.readouterr().err


CODE = """
import asyncio, json, sys
import canonicalize.predict
from canonicalize.texts import Texts
from proxy.store.memory import MemoryStore
print(json.dumps([
    sys.modules["canonicalize.predict"].split_uncached(None, 10, 0),
    Texts().intern("t", "x"),
    asyncio.run(MemoryStore().blobs("t", ["r"])),
]))
"""


def _run(without: list[list[object]], tmp_path: Path) -> tuple[list[object], list[str]]:
    done = tmp_path / "done.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(bench_paired.WITHOUT), str(REPO)]),
        "PREFIXPIN_WITHOUT": json.dumps(without),
        "PREFIXPIN_WITHOUT_DONE": str(done),
    }
    out = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), done.read_text().split()


def test_the_named_functions_do_nothing(tmp_path: Path) -> None:
    without = [
        ["canonicalize.predict", "split_uncached", {"new": 1}],
        ["canonicalize.texts", "Texts.intern", "y"],
        ["proxy.store.memory", "MemoryStore.blobs", [b"x".decode()]],
    ]
    got, done = _run(without, tmp_path)
    assert got == [{"new": 1}, "y", ["x"]]  # the coroutine function's stand-in is one too
    assert sorted(done) == sorted(f"{m}:{n}" for m, n, _ in without)


def test_a_name_not_there_is_said(tmp_path: Path) -> None:
    got, done = _run([["canonicalize.predict", "no_such_function", None]], tmp_path)
    assert got == [{"new": 10}, "x", [None]]  # nothing else replaced
    assert done == ["!canonicalize.predict:no_such_function"]
