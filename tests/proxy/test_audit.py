"""prefixpin audit, run as a user runs it: the CLI on a trace file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests import hermes
from tests.infra.procs import prefixpin_argv

U1 = {"role": "user", "content": "List files"}
R1 = {"role": "assistant", "content": "README.md"}
R2 = {"role": "assistant", "content": "done"}
KEY = {"Authorization": "Bearer sk-audit"}


def _trace(tmp_path: Path) -> Path:
    h2 = [U1, R1, {"role": "user", "content": "more"}]
    fork_history = [*h2, R2, {"role": "user", "content": hermes.REVIEW_PROMPT}]
    lines: list[Any] = [
        {
            "t": 0,
            "headers": KEY,
            "body": hermes.request(hermes.system_prompt(minute="02:30 PM"), [U1], hermes.tools_full()),
            "response": R1,
            "note": "x",
        },
        {
            "t": 60,
            "headers": KEY,
            "kind": "turn",
            "response": {"choices": [{"message": R2}]},
            "body": hermes.request(hermes.system_prompt(minute="02:31 PM", pct=50), h2, hermes.tools_full()),
        },
        "not an object",
        {
            "t": 61,
            "headers": KEY,
            "kind": "fork",
            "body": hermes.request(
                hermes.system_prompt(minute="02:32 PM", session="20260513_204511_9e319e", skills=hermes.SKILLS_REVIEW),
                fork_history,
                hermes.tools_review(),
            ),
        },
        {
            "t": 62,
            "headers": {"Authorization": "Bearer other"},
            "body": hermes.request(hermes.system_prompt(minute="02:40 PM"), [U1], hermes.tools_full()),
        },
    ]
    path = tmp_path / "trace.jsonl"
    text = "\n".join(json.dumps(line) for line in lines)
    path.write_text(text[:] + "\n{this is not json\n\n")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefixpin_argv(), "audit", *args], capture_output=True, text=True, timeout=120)


def test_audit_json(tmp_path: Path) -> None:
    out = _run(str(_trace(tmp_path)), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["requests"] == 4
    assert [m["line"] for m in report["malformed_lines"]] == [3, 6]
    assert "trace.jsonl:6: skipped: not JSON" in out.stderr
    kinds = {lin["id"]: (lin["kind"], lin["parent"]) for lin in report["lineages"]}
    assert kinds == {"L1": ("root", None), "L2": ("fork", "L1"), "L3": ("root", None)}
    total = report["total"]
    assert total["cacheable_after"] > total["cacheable_before"] > 0
    assert total["breaks_before"] == {"system_changed": 2}
    assert total["breaks_after"] == {}


def test_audit_text_table(tmp_path: Path) -> None:
    out = _run(str(_trace(tmp_path)), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "4 requests, 3 lineages (1 fork, 2 root), 2 malformed lines skipped" in out.stdout
    assert "system_changed: 2 -> -" in out.stdout


def test_audit_missing_file() -> None:
    out = _run("/nonexistent/trace.jsonl")
    assert out.returncode == 2
    assert "cannot read" in out.stderr


def test_audit_reads_responses_lines(tmp_path: Path) -> None:
    """Codex-shaped ``/v1/responses`` lines: a reply recorded from the whole response,
    a full replay and a ``previous_response_id`` turn continue one lineage."""
    instructions = "You are Codex, a coding agent. " * 10
    task = {"role": "user", "content": [{"type": "input_text", "text": "fix it"}]}
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    body = {"model": "gpt-5", "instructions": instructions, "tools": [{"type": "function", "name": "shell"}]}
    resp = {"id": "resp_1", "object": "response", "output": [call], "usage": {"input_tokens": 9}}
    lines = [
        {"t": 0, "headers": KEY, "path": "/v1/responses", "body": {**body, "input": [task]}, "response": resp},
        {"t": 1, "headers": KEY, "path": "/v1/responses", "body": {**body, "input": [task, call, out]}},
        {
            "t": 2,
            "headers": KEY,
            "path": "/v1/responses",
            "body": {**body, "input": [out], "previous_response_id": "resp_1"},
        },
    ]
    path = tmp_path / "codex.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = _run(str(path), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"] == 3
    assert [(lin["kind"], lin["parent"]) for lin in report["lineages"]] == [("root", None)]


def test_audit_prices_the_saving(tmp_path: Path) -> None:
    config = tmp_path / "prices.yaml"
    price = "{input: 3, cached_input: 0.3, cache_write: 3.75, output: 15}"
    config.write_text(f"provider_cache:\n  prices:\n    tiny: {price}\n")
    out = _run(str(_trace(tmp_path)), "--json", "--config", str(config))
    assert out.returncode == 0, out.stderr
    tiny = json.loads(out.stdout)["savings"]["tiny"]
    assert tiny["cached_tokens_after"] > tiny["cached_tokens_before"] > 0
    # The reads' saving minus the writes' extra cost, as prefixpin_saved_usd_total counts it.
    assert tiny["cache_write_tokens_before"] > tiny["cache_write_tokens_after"] > 0
    for when in ("before", "after"):
        reads, writes = tiny[f"cached_tokens_{when}"] * 2.7, tiny[f"cache_write_tokens_{when}"] * 0.75
        assert tiny[f"saved_usd_{when}"] == round((reads - writes) / 1e6, 6)
    text = _run(str(_trace(tmp_path)), "--no-progress", "--config", str(config)).stdout
    assert "saving at the model's prices (cached tokens ~ bytes / 4; minus cache writes' extra cost)" in text
    assert f"tiny: ${tiny['saved_usd_before']:.4f} -> ${tiny['saved_usd_after']:.4f}" in text
