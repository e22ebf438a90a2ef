"""``bench_inprocess --stages``: every step it names still exists, each is timed and
put back, and the steps and the rest add up to the whole."""

from __future__ import annotations

import pytest

from benchmarks import bench_inprocess


def test_every_step_is_a_function_of_the_request_path() -> None:
    for label, owner, attr in bench_inprocess.STAGES:
        assert callable(getattr(owner, attr)), label


def test_the_table_adds_up_and_the_steps_are_put_back(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_inprocess, "tune_gc", lambda: None)  # (the test process's collector left alone)
    before = [getattr(owner, attr) for _, owner, attr in bench_inprocess.STAGES]
    assert bench_inprocess.main(["--stages", "--requests", "48", "--conversations", "4", "--turns", "3"]) == 0
    assert [getattr(owner, attr) for _, owner, attr in bench_inprocess.STAGES] == before
    lines = capsys.readouterr().out.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[0] == "step"
    assert any(h.startswith("body continuation") for h in header)
    assert any(h.startswith("mix continuation") for h in header)
    rows = {cells[0]: [float(v.replace(",", "")) for v in cells[1:]] for cells in _cells(lines[2:])}
    assert [label.strip() for label, _, _ in bench_inprocess.STAGES] + ["the rest", "all"] == list(rows)
    top_labels = [label for label, _, _ in bench_inprocess.STAGES if not label.startswith(" ")]
    rounding = 0.05 * (len(top_labels) + 2) + 1e-9  # every cell is rounded to 0.1: half of it each, summed
    for column in range(len(header) - 1):
        top = sum(rows[label][column] for label in top_labels)
        assert top + rows["the rest"][column] == pytest.approx(rows["all"][column], abs=rounding)
        assert rows["parse"][column] > 0 and rows["all"][column] > 0


def _cells(lines: list[str]) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
