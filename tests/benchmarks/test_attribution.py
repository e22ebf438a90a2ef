"""The attribution benchmark's generator and scoring, smoke-sized: every injected
change named right, no cause on an append-only request (chat and Messages)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_attribution as bench


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_every_injected_change_is_named_and_no_append_only_turn_gets_a_cause(api: str, tmp_path: Path) -> None:
    result = bench.run(replace(bench.SMOKE, api=api), tmp_path)
    for view in ("as_sent", "after"):
        v = result[view]
        assert v["injected"] >= 30 and v["append_only"] >= 80, v
        assert (v["named"], v["misnamed"], v["missed"], v["false_causes"]) == (v["injected"], 0, 0, 0), v["wrong"]
        assert all(sum(c.values()) >= 5 for c in v["by_cause"].values()), v["by_cause"]


def test_the_generator_injects_exactly_one_change_and_keeps_the_rest_append_only() -> None:
    lines = bench.generate(bench.Spec(sessions=4, turns=5, rate=0.4, seed=1))
    by_session: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        agent = line["body"]["messages"][0]["content"].split(",")[0]
        by_session.setdefault(agent, []).append(line)
    for session in by_session.values():
        for prev, cur in itertools.pairwise(session):
            a, b = prev["body"], cur["body"]
            changed = {k for k in a.keys() | b.keys() if k != "messages" and a.get(k) != b.get(k)}
            if a["messages"][0] != b["messages"][0]:
                changed.add("system")
            if b["messages"][1 : len(a["messages"])] != a["messages"][1:]:
                changed.add("history")
            expected = {
                None: set(),
                "system_changed": {"system"},
                "tools_changed": {"tools"},
                "model_changed": {"model"},
                "history_rewritten": {"history"},
            }
            if cur["inject"] == "params_changed":
                assert len(changed) == 1 and changed <= {"reasoning_effort", "chat_template_kwargs", "tool_choice"}
            else:
                assert changed == expected[cur["inject"]], (cur["inject"], changed)
