"""``--evict``'s amounts and ``--rounds``: a bad one is refused by name, not met as a traceback halfway."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import bench_inprocess, bench_mypyc


def test_amounts_are_read_in_mib() -> None:
    assert bench_inprocess.mib_list("0,2,8.5") == [0.0, 2.0, 8.5]
    assert bench_mypyc.parse(["--evict", "8"]).evict == 8.0


@pytest.mark.parametrize("text", ["-1", "x", "1,,2", str(bench_inprocess.MAX_EVICT_MIB + 1)])
def test_a_bad_amount_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bench_inprocess.mib_list(text)


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5"])
def test_a_bad_number_of_rounds_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bench_inprocess.positive(text)


def test_rounds_go_with_another_revision(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_inprocess.positive("8") == 8
    with pytest.raises(SystemExit):
        bench_inprocess.main(["--evict", "0", "--rounds", "2"])
    assert "--rounds goes with --compare-ref" in capsys.readouterr().err


def test_bench_mypyc_takes_one_amount(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_mypyc.parse(["--evict", "1,2"])
    assert "one amount of MiB" in capsys.readouterr().err
