"""``bench_paired --without`` and ``bench_parts``: their specs, and
``without/sitecustomize.py`` replacing or timing the named functions in a fresh
interpreter (a function, a method, an ``async def``), and saying which names were
not there."""

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


def test_env_specs() -> None:
    assert bench_paired.env_spec("PYTHONMALLOC=malloc") == ("PYTHONMALLOC", "malloc")
    assert bench_paired.env_spec("GLIBC_TUNABLES=a=1:b=2") == ("GLIBC_TUNABLES", "a=1:b=2")
    assert bench_paired.env_spec("EMPTY=") == ("EMPTY", "")
    for bad in ("PYTHONMALLOC", "=malloc", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_paired.env_spec(bad)


def test_a_warm_up_of_less_than_a_second_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_paired.main(["--warm-up", "0"])
    assert "--warm-up" in capsys.readouterr().err


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


TIMED_CODE = """
import asyncio, json, os, signal, sys, time
from canonicalize.texts import Texts
from proxy.store.memory import MemoryStore
from canonicalize import predict
out = os.environ["PREFIXPIN_TIMED_OUT"]
Texts().intern("t", "before")  # not counted: counting starts with the first SIGUSR1
os.kill(os.getpid(), signal.SIGUSR1)
for _ in range(3):
    Texts().intern("t", "x")
    asyncio.run(MemoryStore().blobs("t", ["r"]))
os.kill(os.getpid(), signal.SIGUSR1)
Texts().intern("t", "after")
print(open(out).read())
"""


def test_timed_functions_count_their_calls_and_cpu_time(tmp_path: Path) -> None:
    """``PREFIXPIN_TIMED`` (``bench_parts``): each named function counts its calls and
    CPU time between two SIGUSR1, a function and a coroutine function alike, and the
    names a module lacks, or a module never imported, are not listed as replaced."""
    done, out = tmp_path / "done.txt", tmp_path / "timed.json"
    timed = [
        ["canonicalize.texts", "Texts.intern"],
        ["proxy.store.memory", "MemoryStore.blobs"],
        ["canonicalize.predict", "no_such_function"],
        ["no.such.module", "f"],
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(bench_paired.WITHOUT), str(REPO)]),
        "PREFIXPIN_TIMED": json.dumps(timed),
        "PREFIXPIN_TIMED_OUT": str(out),
        "PREFIXPIN_WITHOUT_DONE": str(done),
    }
    run = subprocess.run([sys.executable, "-c", TIMED_CODE], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    counted = json.loads(run.stdout)
    assert sorted(counted) == ["canonicalize.texts:Texts.intern", "proxy.store.memory:MemoryStore.blobs"]
    assert all(calls == 3 and ns > 0 for calls, ns in counted.values())
    assert sorted(done.read_text().split()) == [
        "!canonicalize.predict:no_such_function",
        "canonicalize.texts:Texts.intern",
        "proxy.store.memory:MemoryStore.blobs",
    ]


def test_parts_specs() -> None:
    from benchmarks import bench_parts

    assert bench_parts.part_spec("proxy.drive:Driver.canonicalize") == ("proxy.drive", "Driver.canonicalize")
    for bad in ("proxy.drive", ":f", "m:", "m:f=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_parts.part_spec(bad)
    with pytest.raises(SystemExit):
        bench_parts.main(["m:f", "--ref-parts", "m:g"])  # REF's names without a REF
    with pytest.raises(SystemExit):
        bench_parts.main(["m:f", "m:f"])  # it would time itself
