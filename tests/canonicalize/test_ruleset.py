"""canonicalize.ruleset: the agents' own session headers name the session, whatever packs are on."""

from __future__ import annotations

import pytest

from canonicalize import Settings
from canonicalize.ruleset import SESSION_HEADERS, RuleSet
from tests.flows import KEY, Harness

USER = {"role": "user", "content": "List the files."}
REPLY = {"role": "assistant", "content": "README.md"}


def body(system: str, *messages: dict[str, str]) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, *messages]}


def test_the_agents_session_headers_are_built_in() -> None:
    assert {"x-claude-code-session-id", "session-id", "x-session-id"} <= set(SESSION_HEADERS)
    for packs in ((), ("generic", "hermes"), ("codex",)):
        assert set(SESSION_HEADERS) <= set(RuleSet.compile(Settings(packs=packs)).identity_headers)


@pytest.mark.parametrize("header", ["x-claude-code-session-id", "session-id", "x-session-id"])
def test_a_session_header_names_the_session_within_the_tenant(header: str) -> None:
    h = Harness()
    first = h.send(body("You are an agent.", USER), reply=REPLY, headers={**KEY, header: "s1"})
    # Another session: same history, same system prompt, another header value: never one lineage.
    other = h.send(
        body("You are an agent.", USER, REPLY, {"role": "user", "content": "next"}), headers={**KEY, header: "s2"}
    )
    assert other.role == "root" and other.record.id != first.record.id
    # The same session, even though its system prompt changed.
    same = h.send(
        body("You are an agent. Be brief.", USER, REPLY, {"role": "user", "content": "next"}),
        headers={**KEY, header: "s1"},
    )
    assert same.role == "continuation" and same.record.id == first.record.id
    # The header is the session only within a tenant.
    elsewhere = h.send(
        body("You are an agent.", USER, REPLY, {"role": "user", "content": "next"}),
        headers={"authorization": "Bearer sk-other", header: "s1"},
    )
    assert elsewhere.role == "root"
