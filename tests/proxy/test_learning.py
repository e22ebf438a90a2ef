"""Learning end to end offline: agents no pack knows (tests.infra.unknown_agents)
through the proxy's own request flow, the metrics and logs, the config key, and
``prefixpin audit --suggest-rules`` as a user runs it."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from canonicalize import Memos
from proxy.config import Config, ConfigError, from_mapping, load
from proxy.offline import Offline, Replayed
from proxy.store.memory import MemoryStore
from tests.infra import unknown_agents as ua
from tests.infra.procs import prefixpin_argv

SPEC = ua.Spec(sessions=3, turns=8, seed=11)


def config(learn: str, **canon: Any) -> Config:
    return from_mapping({"canonicalize": {"learn": learn, **canon}, "tenancy": {"anonymous": "shared"}})


def run(lines: Sequence[dict[str, Any]], cfg: Config, *, replies: bool = True) -> list[Replayed]:
    return asyncio.run(ua.run(lines, cfg, replies=replies))


@pytest.fixture(scope="module")
def lines() -> list[dict[str, Any]]:
    return ua.generate(SPEC)


# -- the config key --------------------------------------------------------------------------
def test_learn_is_suggest_by_default_and_off_is_the_word(tmp_path: Path) -> None:
    assert load(None, env={}).canonicalize.learn == "suggest"
    path = tmp_path / "c.yaml"
    path.write_text("canonicalize:\n  learn: off\n")
    assert load(path, env={}).settings().learn == "off"
    with pytest.raises(ConfigError, match=r"canonicalize.learn: must be one of off, suggest, pin \(got 'always'\)"):
        from_mapping({"canonicalize": {"learn": "always"}})


# -- the unknown agents' trace -------------------------------------------------------------------
@pytest.mark.parametrize("replies", [True, False], ids=["replies", "no-replies"])
def test_pin_forwards_what_a_fixed_agent_sends(lines: list[dict[str, Any]], replies: bool) -> None:
    flows = run(lines, config("pin"), replies=replies)
    score = ua.score(lines, [f.out for f in flows])
    assert score.leaks == 0
    assert score.edits == 14 and score.edits_pinned == 0
    # Without recorded replies two sessions that ask the same first thing and carry no
    # value of their own in the prompt cannot be told apart: neither is continued.  A
    # counter's first change reaches the upstream (one change is no evidence): what a
    # prefix cache serves of the system texts is what a fixed agent's would, but that.
    assert score.kept >= (0.98 if replies else 0.9), score.misses
    assert all(f.role in ("root", "continuation") for f in flows)


def test_learning_forwards_the_same_with_and_without_memos(lines: list[dict[str, Any]]) -> None:
    kept = run(lines, config("pin"))
    fresh = asyncio.run(ua.run(lines, config("pin"), memos=Memos.off()))
    assert [f.out for f in fresh] == [f.out for f in kept]
    assert [(f.role, f.rewrites) for f in fresh] == [(f.role, f.rewrites) for f in kept]
    assert [f.outcome.record for f in fresh if f.outcome] == [f.outcome.record for f in kept if f.outcome]


def test_suggest_changes_no_byte_nor_role(lines: list[dict[str, Any]]) -> None:
    off = run(lines, config("off"))
    suggest = run(lines, config("suggest"))
    assert [f.out for f in suggest] == [f.out for f in off]
    assert [f.role for f in suggest] == [f.role for f in off]
    assert sum(len(f.outcome.learned) for f in suggest if f.outcome) > 100
    assert all(not f.outcome.learned for f in off if f.outcome)


def test_learned_spans_are_counted_by_class_and_learned_rewrites_exist_from_the_start(
    lines: list[dict[str, Any]],
) -> None:
    offline = Offline(config("pin"))
    text = generate_latest(offline.s.metrics.registry).decode()
    for cls in ("time", "date", "uuid", "hex_id", "counter", "other"):
        assert f'prefixpin_learned_spans_total{{class="{cls}"}} 0.0' in text
    for rule in ("learned.time", "learned.date", "learned.uuid", "learned.hex_id", "learned.counter"):
        assert f'prefixpin_rewrites_total{{rule="{rule}"}} 0.0' in text

    async def go() -> None:
        for line in lines[:40]:
            await offline.send(line["body"], exchange=ua.EXCHANGES[line["agent"]], headers=line["headers"])

    asyncio.run(go())
    text = generate_latest(offline.s.metrics.registry).decode()
    for cls in ("time", "uuid", "counter", "hex_id"):
        assert f'prefixpin_learned_spans_total{{class="{cls}"}} 0.0' not in text


def test_each_pattern_is_logged_once_per_tenant_with_its_rule(
    lines: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="prefixpin"):
        flows = run(lines, config("suggest"))
    logged = [r.getMessage() for r in caplog.records if "learned a volatile" in r.getMessage()]
    request_id = [m for m in logged if "Request-Id" in m]
    assert len(request_id) == 2  # two tenants, one line each
    assert "add to canonicalize.rules: {name: learned_request_id, pattern: '^Request-Id: (?P<v>" in request_id[0]
    assert "action: pin, scope: system}" in request_id[0]
    values = {v for line in lines for v in line["values"] if not v.startswith("ws-")} - {"200,000"}
    assert not any(v in m for v in values for m in logged)  # a rule, never a value
    assert sum(len(f.outcome.learned) for f in flows if f.outcome) > len(logged)


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__(ttl_s=3600, max_entries=10_000)
        self.blob_calls = 0

    async def blobs(self, tenant: str, refs: Sequence[str]) -> list[bytes | None]:
        self.blob_calls += 1
        return await super().blobs(tenant, refs)


def test_an_agent_that_sends_stable_bytes_pays_nothing_for_learning() -> None:
    from tests import hermes

    store = CountingStore()
    offline = Offline(config("suggest"), store=store)
    user = {"role": "user", "content": "List the files."}
    history: list[dict[str, Any]] = [user]

    async def go() -> None:
        for turn in range(6):
            body = hermes.request(hermes.system_prompt(minute=f"02:3{turn} PM"), history, hermes.tools_full())
            flow = await offline.send(
                body, headers={"authorization": "Bearer k"}, reply={"role": "assistant", "content": f"r{turn}"}
            )
            assert flow.role == ("root" if turn == 0 else "continuation")
            assert flow.outcome is not None and flow.outcome.learned == ()
            history.extend([{"role": "assistant", "content": f"r{turn}"}, {"role": "user", "content": f"u{turn}"}])

    asyncio.run(go())
    assert store.blob_calls == 0


# -- prefixpin audit --suggest-rules ----------------------------------------------------------------
def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefixpin_argv(), "audit", *args], capture_output=True, text=True, timeout=300)


def test_suggest_rules_stabilize_the_trace_as_learn_pin_does(lines: list[dict[str, Any]], tmp_path: Path) -> None:
    trace = ua.write(tmp_path / "trace.jsonl", lines)
    out = _audit(str(trace), "--suggest-rules", "--no-progress")
    assert out.returncode == 0, out.stderr
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(out.stdout)
    check = subprocess.run(
        [*prefixpin_argv(), "check-config", str(rules_path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    doc = yaml.safe_load(out.stdout)
    assert set(doc) == {"canonicalize"} and set(doc["canonicalize"]) == {"rules"}
    rules = doc["canonicalize"]["rules"]
    assert {r["name"] for r in rules} >= {"learned_current_time", "learned_request_id", "learned_nonce"}
    values = {v for line in lines for v in line["values"]}
    assert not any(v in r["pattern"] for v in values for r in rules)
    # Used as the config with learn: off, the rules forward the system texts learn: pin does,
    # but for the sessions that edited their prompt (module proxy.cli.suggest), from the edit
    # on, and a counter, which a rule pins from the first request on (learn: pin waits for
    # its line to change twice): there the rules forward what the fixed agent sends.
    by_rules = run(
        lines,
        from_mapping(
            {**doc, "canonicalize": {**doc["canonicalize"], "learn": "off"}, "tenancy": {"anonymous": "shared"}}
        ),
    )
    by_pin = run(lines, config("pin"))
    differ = {
        (line["session"], line["turn"])
        for line, a, b in zip(lines, by_rules, by_pin, strict=True)
        if ua.system_texts(line["agent"], a.out) != ua.system_texts(line["agent"], b.out)
    }
    edited = {line["session"] for line in lines if line["edits"]}
    fixed = {
        (line["session"], line["turn"])
        for line, a in zip(lines, by_rules, strict=True)
        if ua.system_texts(line["agent"], a.out) == line["fixed"]
    }
    assert differ and all(
        (s, t) in fixed or (s in edited and any(ln["edits"] for ln in lines if (ln["session"], ln["turn"]) == (s, t)))
        for s, t in differ
    )
    score = ua.score(lines, [f.out for f in by_rules])
    assert score.leaks == 0 and score.edits_pinned == 0


def test_suggest_rules_keep_the_configs_own_packs_and_rules(tmp_path: Path) -> None:
    lines = ua.generate(ua.Spec(sessions=1, turns=3, seed=2, tenants=1))
    trace = ua.write(tmp_path / "t.jsonl", lines)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "canonicalize:\n  packs: [generic, hermes, codex]\n  rules:\n"
        "    - {name: my_clock, pattern: 'Local time: (?P<v>\\S+)', action: pin}\n"
    )
    out = _audit(str(trace), "--config", str(cfg), "--suggest-rules", "--no-progress")
    assert out.returncode == 0, out.stderr
    section = yaml.safe_load(out.stdout)["canonicalize"]
    assert section["packs"] == ["generic", "hermes", "codex"]
    assert section["rules"][0]["name"] == "my_clock"
    assert len(section["rules"]) > 1
