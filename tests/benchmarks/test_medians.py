"""The overhead benchmark's rounds: one row per target and phase, each figure the
median of its rounds, requests and errors summed (``benchmarks.overhead.rounds.medians``),
and a share of nginx taken round by round (``report.ratio``)."""

from __future__ import annotations

from typing import Any

from benchmarks.overhead.report import ratio
from benchmarks.overhead.rounds import medians


def _run(target: str, p50: float, rps: float, errors: int = 0) -> dict[str, Any]:
    return {
        "target": target,
        "phase": "body-c16",
        "latency_ms": {"p50": p50, "p99": 2 * p50},
        "rps": rps,
        "cpu_ms_per_req": p50 / 2,
        "requests": 10,
        "errors": errors,
        "error_kinds": {"timeout": errors} if errors else {},
    }


def test_rounds_become_one_row_of_medians_per_target_and_phase() -> None:
    runs = [_run("a", 1.0, 100), _run("b", 5.0, 10), _run("a", 3.0, 300, errors=2), _run("a", 2.0, 200)]
    runs.append({"target": "c", "phase": "body-c16", "unavailable": "not installed"})
    rows = {r["target"]: r for r in medians(runs)}
    a = rows["a"]
    assert a["latency_ms"] == {"p50": 2.0, "p99": 4.0}
    assert a["rps"] == 200 and a["cpu_ms_per_req"] == 1.0
    assert a["requests"] == 30 and a["errors"] == 2 and a["error_kinds"] == {"timeout": 2}
    assert [r["p50"] for r in a["rounds"]] == [1.0, 3.0, 2.0]
    assert rows["b"]["rounds"] == [{"rps": 10, "p50": 5.0}]
    assert rows["c"]["unavailable"] == "not installed"


def test_a_share_is_the_median_of_the_rounds_ratios() -> None:
    # Round 2 ran in a slow minute for both: the per-round ratios agree, the medians would not.
    prefixpin = medians([_run("p", 1, 300), _run("p", 1, 100), _run("p", 1, 310)])[0]
    nginx = medians([_run("n", 1, 3000), _run("n", 1, 1000), _run("n", 1, 2900)])[0]
    assert ratio(prefixpin, nginx) == 0.1
    assert ratio(prefixpin, {"rps": 3000}) == 0.1  # no rounds to pair: the medians


def test_every_other_round_takes_the_targets_in_reverse_order() -> None:
    from benchmarks.overhead.rounds import turns

    targets: list[Any] = ["direct", "nginx", "prefixpin"]
    assert [turns(targets, r) for r in range(3)] == [
        ["direct", "nginx", "prefixpin"],
        ["prefixpin", "nginx", "direct"],
        ["direct", "nginx", "prefixpin"],
    ]
    assert targets == ["direct", "nginx", "prefixpin"]  # the caller's list is left as it was
