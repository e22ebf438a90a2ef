"""The overhead benchmark's rounds: one row per target and phase, each figure the
median of its rounds, errors summed (benchmarks/overhead/run.py ``medians``)."""

from __future__ import annotations

from typing import Any

from benchmarks.overhead.run import medians


def _run(target: str, p50: float, rps: float, errors: int = 0) -> dict[str, Any]:
    return {
        "target": target,
        "phase": "closed-plain-1",
        "latency_ms": {"p50": p50, "p99": 2 * p50},
        "achieved_rps": rps,
        "cpu_ms_per_req": p50 / 2,
        "sent": 10,
        "ok": 10 - errors,
        "errors": errors,
        "error_kinds": {"timeout": errors} if errors else {},
    }


def test_rounds_become_one_row_of_medians_per_target_and_phase() -> None:
    runs = [_run("a", 1.0, 100), _run("b", 5.0, 10), _run("a", 3.0, 300, errors=2), _run("a", 2.0, 200)]
    runs.append({"target": "c", "phase": "closed-plain-1", "unavailable": "not installed"})
    rows = {r["target"]: r for r in medians(runs)}
    a = rows["a"]
    assert a["latency_ms"] == {"p50": 2.0, "p99": 4.0}
    assert a["achieved_rps"] == 200 and a["cpu_ms_per_req"] == 1.0
    assert a["sent"] == 30 and a["errors"] == 2 and a["error_kinds"] == {"timeout": 2}
    assert [r["p50"] for r in a["rounds"]] == [1.0, 3.0, 2.0]
    assert rows["b"] == _run("b", 5.0, 10)  # one round: as measured
    assert rows["c"]["unavailable"] == "not installed"
