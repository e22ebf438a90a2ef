"""canonicalize.minimums: the providers' minimum cacheable prompts and a request's
stable prefix."""

from __future__ import annotations

from typing import Any

import pytest

from canonicalize import CHAT, RESPONSES, Fingerprint
from canonicalize.minimums import BYTES_PER_TOKEN, minimum, normalized, stable_bytes, stable_tokens


@pytest.mark.parametrize(
    ("model", "tokens"),
    [
        ("gpt-5.6", 1024),
        ("openai/gpt-5.6-sol", 1024),
        ("gpt-4o-mini", 1024),
        ("gpt-4.1", 1024),
        ("o3", 1024),
        ("claude-opus-4-6", 4096),
        ("anthropic/claude-opus-4.5", 4096),
        ("claude-opus-4-7", 4096),
        ("claude-haiku-4-5-20251001", 4096),
        ("claude-opus-4-1-20250805", 1024),
        ("claude-opus-4-20250514", 1024),
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-sonnet-4-6", 1024),
        ("claude-3-5-haiku-20241022", 2048),
        ("gemini-2.5-flash", 2048),
        ("gemini/gemini-2.5-pro", 2048),
        ("gemini-3.1-pro-preview", 4096),
        ("gemini-3.5-flash", 4096),
        ("deepseek-chat", None),
        ("mistral-large-latest", None),
        ("grok-4", None),
        ("gpt-oss-120b", None),
        ("tiny", None),
        ("", None),
        (None, None),
    ],
)
def test_built_in_minimums(model: Any, tokens: int | None) -> None:
    assert minimum(model) == tokens


def test_configured_minimums_win_and_zero_turns_one_off() -> None:
    configured = {"my-model": 2048, "gpt-5.6": 0, "claude-opus-4-6": 1024}
    assert minimum("my-model", configured) == 2048
    assert minimum("gpt-5.6", configured) == 0
    assert minimum("claude-opus-4-6", configured) == 1024
    assert minimum("openai/my-model", configured) is None  # configured names are exact
    assert normalized("Anthropic/Claude-Opus-4.6") == "claude-opus-4-6"


def _fp(system: int, tools: int) -> Fingerprint:
    return Fingerprint(model="m", system_len=system, tools_len=tools)


def test_stable_bytes_end_before_the_last_user_message() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "tool", "content": "t"},
            {"role": "user", "content": "q2"},
        ]
    }
    sizes = [10, 20, 30, 40]  # the history: q1, a1, t, q2
    assert stable_bytes(CHAT, body, _fp(100, 50), sizes) == (150 + 60, 150 + 100)
    first = {"messages": body["messages"][:2]}
    assert stable_bytes(CHAT, first, _fp(100, 50), [10]) == (150, 160)
    # A previous response's tip stands first in the sizes (size 0).
    responses = {"previous_response_id": "r", "input": [{"role": "user", "content": "more"}]}
    assert stable_bytes(RESPONSES, responses, _fp(0, 0), [0, 7], offset=1) == (0, 7)


def test_stable_tokens_at_the_requests_own_rate() -> None:
    assert stable_tokens(800, 1000, 500) == 400
    assert stable_tokens(800, 1000, None) == 800 // BYTES_PER_TOKEN
    assert stable_tokens(0, 0, 10) == 0
    # The provider keeps the conversation: all of the prompt but the new turn.
    assert stable_tokens(0, 400, 5000, continued=True) == 5000 - 400 // BYTES_PER_TOKEN
