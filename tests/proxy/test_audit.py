"""prefixpin audit, run as a user runs it: the CLI on a trace file."""

from __future__ import annotations

import json
import re
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
    assert report["total"]["requests"] == len(report["requests"]) == 4
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
    assert len(report["requests"]) == 3
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


# -- every request named, with evidence; the CI gate; the HTML page ---------------------------
SYSTEM = "You are Atlas, a coding agent. Read the code before you change it. " * 12 + "Now: 2026-05-14T14:30:00Z"


def _tool(name: str, desc: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {"type": "object"}}}


TOOLS = [_tool("shell", "Run a command."), _tool("read", "Read a file.")]


def _chat(history: list[dict[str, Any]], *, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "system", "content": system}, *history], "tools": TOOLS, **extra}


def _causes_trace(tmp_path: Path, *, hostile: str = "") -> Path:
    """One conversation: a moved timestamp (pinned: fixed), a tool added (left), an
    earlier user message rewritten (left), then the conversation replayed under an
    edited system (a lineage of its own: left); the lines carry usage."""
    u = [{"role": "user", "content": f"Find the flaky test {i}.{hostile}"} for i in range(6)]
    a = [{"role": "assistant", "content": f"Looked at test {i}."} for i in range(6)]
    now = SYSTEM.replace("14:30", "14:31")  # generic.iso_datetime pins it
    grep = [*TOOLS, _tool("grep", "Search files.")]
    h: list[dict[str, Any]] = [u[0]]
    bodies = [_chat(h)]
    h += [a[0], u[1]]
    bodies.append(_chat(h, system=now))
    h += [a[1], u[2]]
    bodies.append({**_chat(h, system=now), "tools": grep})
    h = [*h[:2], {"role": "user", "content": "Find the flaky test 1, please."}, *h[3:], a[2], u[3]]
    bodies.append({**_chat(h, system=now), "tools": grep})
    h += [a[3], u[4]]
    bodies.append({**_chat(h, system=now.replace("Atlas", "Atlas 2" + hostile, 1)), "tools": grep})
    lines = [
        {
            "t": i,
            "headers": KEY,
            "body": b,
            "response": a[i],
            "usage": {"prompt_tokens": 1000 + i, "cached_tokens": 900},
        }
        for i, b in enumerate(bodies)
    ]
    path = tmp_path / "causes.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_audit_json_names_every_request_with_its_evidence(tmp_path: Path) -> None:
    out = _run(str(_causes_trace(tmp_path)), "--json")
    assert out.returncode == 0, out.stderr
    requests = json.loads(out.stdout)["requests"]
    assert [r["index"] for r in requests] == [0, 1, 2, 3, 4]
    assert [r["role"] for r in requests] == ["root", "continuation", "continuation", "continuation", "root"]
    assert [r["lineage"] for r in requests] == ["L1", "L1", "L1", "L1", "L2"]
    assert [r["parent"] for r in requests] == [None, 0, 1, 2, 3]
    assert [r["cause_before"] for r in requests] == [
        None,
        "system_changed",
        "tools_changed",
        "history_rewritten",
        "system_changed",
    ]
    assert [r["cause"] for r in requests] == [None, None, "tools_changed", "history_rewritten", "system_changed"]
    assert requests[0]["evidence"] is None and requests[1]["evidence"] is None
    fixed = requests[1]["evidence_before"]
    assert fixed["field"] == "system" and fixed["offset"] == len(SYSTEM) - len("0:00Z")
    assert (fixed["before"], fixed["after"]) == (SYSTEM[-29:], SYSTEM[-29:].replace("14:30", "14:31"))
    assert requests[2]["evidence"] == {"field": "tools[2]", "offset": 0, "before": "", "after": ANY_GREP}
    rewrite = requests[3]["evidence"]
    assert rewrite["field"] == "messages[3].content" and rewrite["offset"] == len("Find the flaky test 1")
    assert (rewrite["before"], rewrite["after"]) == ("Find the flaky test 1.", "Find the flaky test 1, please.")
    edit = requests[4]["evidence"]
    assert edit["field"] == "system" and edit["offset"] == len("You are Atlas")
    for r in requests:
        for ev in (r["evidence"], r["evidence_before"]):
            assert ev is None or (len(ev["before"]) <= 80 and len(ev["after"]) <= 80)
        assert r["usage"]["prompt_tokens"] == 1000 + r["index"]
        assert sum(r["uncached"].values()) == 100 + r["index"]


ANY_GREP = '{"name":"grep","description":"Search files.","parameters":{"type":"object"}}'


def test_audit_text_names_the_breaks_left(tmp_path: Path) -> None:
    out = _run(str(_causes_trace(tmp_path)), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "breaks after canonicalization" in out.stdout
    assert "  #2     L1 continuation, tools_changed, tools[2] at byte 0" in out.stdout  # #index: its line from 0
    assert "  #4     L2 root, system_changed, system at byte 13" in out.stdout
    assert "uncached by cause:" in out.stdout


def test_fail_on_and_min_ratio_gate_ci(tmp_path: Path) -> None:
    trace = str(_causes_trace(tmp_path))
    out = _run(trace, "--fail-on", "system_changed,tools_changed", "--no-progress")
    assert out.returncode == 3, out.stderr
    assert "gate failed: request #2 (L1, continuation): tools_changed in tools[2] at byte 0 against #1" in (out.stderr)
    assert "request #4 (L2, root): system_changed in system at byte 13" in out.stderr
    assert "prefixpin audit:" in out.stdout  # the report is printed all the same
    assert _run(trace, "--fail-on", "model_changed,params_changed", "--json").returncode == 0
    assert _run(trace, "--fail-on", "any", "--json").returncode == 3
    assert _run(trace, "--min-ratio", "0.1", "--json").returncode == 0
    low = _run(trace, "--min-ratio", "0.99", "--json")
    assert low.returncode == 3 and "is below 0.99" in low.stderr
    for bad in (["--fail-on", "sytem_changed"], ["--fail-on", ","], ["--min-ratio", "2"], ["--min-ratio", "x"]):
        usage = _run(trace, *bad)
        assert usage.returncode == 2, (bad, usage.stderr)
    ok = tmp_path / "ok.jsonl"
    lines = [{"headers": KEY, "body": _chat([{"role": "user", "content": "hi"}]), "response": R1}]
    lines.append({"headers": KEY, "body": _chat([{"role": "user", "content": "hi"}, R1, U1])})
    ok.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert _run(str(ok), "--fail-on", "any", "--min-ratio", "0.4", "--json").returncode == 0


def test_html_is_one_self_contained_page_and_escapes_the_trace(tmp_path: Path) -> None:
    hostile = '</pre><script>alert(1)</script><img src="http://evil.example/x.png">'
    page = tmp_path / "report.html"
    out = _run(str(_causes_trace(tmp_path, hostile=hostile)), "--html", str(page), "--no-progress")
    assert out.returncode == 0, out.stderr
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "evil.example" not in html.replace("&quot;http://evil.example", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert re.findall(r'(?:src|href)="([^"#][^"]*)"', html) == []  # nothing loaded, no link out
    assert "default-src 'none'" in html
    assert html.count('class="request"') == 5
    assert html.count('<article class="break"') == 4
    assert "<ins>" in html and "<del" in html
    unwritable = _run(str(_causes_trace(tmp_path)), "--html", str(tmp_path / "no" / "such" / "dir.html"))
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr


def test_a_line_with_a_lone_surrogate_is_skipped_not_fatal(tmp_path: Path) -> None:
    """JSON text can carry a lone surrogate, which no request body can hold as UTF-8."""
    bad = _chat([{"role": "user", "content": "hi \ud800"}])
    lines = [{"headers": KEY, "body": _chat([U1]), "response": R1}, {"headers": KEY, "body": bad}]
    lines.append({"headers": KEY, "body": _chat([U1, R1, {"role": "user", "content": "more"}])})
    path = tmp_path / "surrogate.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = _run(str(path), "--json", "--html", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [m["line"] for m in report["malformed_lines"]] == [2]
    assert [(r["index"], r["role"], r["parent"]) for r in report["requests"]] == [
        (0, "root", None),
        (2, "continuation", 0),
    ]


# -- traces prefixpin serve --trace recorded -----------------------------------------------


def _recorded(body: dict[str, Any], tenant: str, i: int, **extra: Any) -> dict[str, Any]:
    """A line as proxy.recording writes it (the body last, compact)."""
    head = {"t": 1.7e9 + i, "path": "/v1/chat/completions", "headers": {}, "tenant": tenant, "lineage": f"x{i}"}
    head |= {"role": "root", "status": 200, "usage": None, "response": None, **extra}
    return head | {"body": body}


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    return path


def test_a_recorded_trace_keeps_its_tenants_apart(tmp_path: Path) -> None:
    """Two tenants send the same conversation (credentials are not in a recorded trace:
    the hashed tenant is); a request without credentials (tenant "") shares nothing."""
    h2 = [U1, R1, {"role": "user", "content": "more"}]
    first, second = _chat([U1]), _chat(h2)
    lines = [
        _recorded(first, "kA", 0, response=R1),
        _recorded(first, "kB", 1, response=R1),
        _recorded(second, "kA", 2),
        _recorded(second, "kB", 3),
        _recorded(first, "", 4, response=R1),
        _recorded(second, "", 5),
    ]
    out = _run(str(_write_lines(tmp_path / "rec.jsonl", lines)), "--json")
    assert out.returncode == 0, out.stderr
    requests = json.loads(out.stdout)["requests"]
    assert [r["role"] for r in requests] == ["root", "root", "continuation", "continuation", "root", "root"]
    assert [r["lineage"] for r in requests] == ["L1", "L2", "L1", "L2", "L3", "L4"]
    assert [r["parent"] for r in requests] == [None, None, 0, 1, None, None]


def test_recorded_usage_is_split_against_what_was_forwarded(tmp_path: Path) -> None:
    """A timestamp prefixpin pins: as sent it breaks the prefix (system_changed), as
    forwarded it does not.  The upstream of a recorded trace was sent what prefixpin
    forwarded, so its usage splits as the live counter did; a line prefixpin bypassed
    is all new; the same lines without ``tenant`` and ``role`` split against as sent."""
    h2 = [U1, R1, {"role": "user", "content": "more"}]
    later = SYSTEM.replace("14:30", "14:31")
    usage = {"prompt_tokens": 1000, "cached_tokens": 900}
    lines = [
        _recorded(_chat([U1]), "kA", 0, response=R1, usage=usage),
        _recorded(_chat(h2, system=later), "kA", 1, role="continuation", usage=usage),
        _recorded(_chat(h2, system=later), "kA", 2, role="bypass", usage=usage),
    ]
    recorded = json.loads(_run(str(_write_lines(tmp_path / "rec.jsonl", lines)), "--json").stdout)["requests"]
    assert recorded[1]["cause_before"] == "system_changed" and recorded[1]["cause"] is None
    assert "system_changed" not in recorded[1]["uncached"] and sum(recorded[1]["uncached"].values()) == 100
    assert recorded[2]["uncached"] == {"new": 100}
    legacy = [{k: v for k, v in line.items() if k not in ("tenant", "role")} for line in lines]
    as_sent = json.loads(_run(str(_write_lines(tmp_path / "sent.jsonl", legacy)), "--json").stdout)["requests"]
    assert set(as_sent[1]["uncached"]) == {"new", "system_changed"}


def test_every_differing_place_of_a_request_is_listed(tmp_path: Path) -> None:
    """The memory counter and, further down, the minute: two places as sent (both
    pinned: none after), the first of them the break's evidence."""
    base = hermes.system_prompt(minute="02:30 PM", pct=49)
    moved = hermes.system_prompt(minute="02:31 PM", pct=52)
    h2 = [U1, R1, {"role": "user", "content": "more"}]
    lines = [
        {"t": 0, "headers": KEY, "body": hermes.request(base, [U1], hermes.tools_full()), "response": R1},
        {"t": 60, "headers": KEY, "body": hermes.request(moved, h2, hermes.tools_full())},
    ]
    requests = json.loads(_run(str(_write_lines(tmp_path / "t.jsonl", lines)), "--json").stdout)["requests"]
    places = requests[1]["places_before"]
    assert requests[1]["cause_before"] == "system_changed" and requests[1]["cause"] is None
    assert len(places) == 2 and places[0] == requests[1]["evidence_before"]
    assert "49%" in places[0]["before"] and "52%" in places[0]["after"]
    assert "02:30 PM" in places[1]["before"] and "02:31 PM" in places[1]["after"]
    assert places[1]["offset"] > places[0]["offset"] and requests[1]["places"] == []
