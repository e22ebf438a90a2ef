"""canonicalize.verdicts: Anthropic's and OpenAI's cache diagnostics in prefixpin's causes."""

from __future__ import annotations

from typing import Any

import pytest

from canonicalize.verdicts import NO_BREAK, agrees, provider_causes


@pytest.mark.parametrize(
    ("diagnostics", "causes"),
    [
        # Anthropic: diagnostics.cache_miss_reason
        ({"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 900}}, {"system_changed"}),
        ({"cache_miss_reason": {"type": "messages_changed"}}, {"history_rewritten"}),
        ({"cache_miss_reason": {"type": "tools_changed"}}, {"tools_changed"}),
        ({"cache_miss_reason": {"type": "model_changed"}}, {"model_changed"}),
        ({"cache_miss_reason": None}, {NO_BREAK}),
        ({"cache_miss_reason": {"type": "previous_message_not_found"}}, None),
        ({"cache_miss_reason": {"type": "unavailable"}}, None),
        ({"cache_miss_reason": "system_changed"}, None),
        # OpenAI Responses: prompt_cache_diagnostics
        ({"type": "cache_hit"}, {NO_BREAK}),
        (
            {
                "type": "cache_miss",
                "reason": "tools_changed",
                "comparison_reusable_tokens": 5629,
                "cache_missed_tokens": 5629,
            },
            {"tools_changed"},
        ),
        ({"type": "cache_miss", "reason": "model_changed", "cache_missed_tokens": 1}, {"model_changed"}),
        ({"type": "cache_miss", "reason": "input_changed"}, {"system_changed", "history_rewritten"}),
        ({"type": "cache_miss", "reason": "context_compacted"}, {"history_rewritten"}),
        ({"type": "cache_miss", "reason": "reasoning_effort_changed"}, {"params_changed"}),
        ({"type": "cache_miss", "reason": "prompt_cache_key_changed"}, {"params_changed"}),
        ({"type": "cache_miss", "reason": "service_tier_changed"}, {"params_changed"}),
        ({"type": "cache_miss", "reason": "text_format_changed"}, {"params_changed"}),
        ({"type": "cache_miss", "reason": "verbosity_changed"}, {"params_changed"}),
        ({"type": "cache_miss", "reason": "a_reason_from_next_year"}, None),
        ({"type": "cache_miss"}, None),
        ({"type": "comparison_response_not_found"}, None),
        ({"type": "unavailable"}, None),
        ({}, None),
        ("junk", None),
        (None, None),
    ],
)
def test_provider_causes(diagnostics: Any, causes: set[str] | None) -> None:
    assert provider_causes(diagnostics) == (frozenset(causes) if causes is not None else None)


def test_agreement() -> None:
    miss = {"type": "cache_miss", "reason": "input_changed"}
    assert agrees("system_changed", miss) is True
    assert agrees("history_rewritten", miss) is True
    assert agrees("tools_changed", miss) is False
    assert agrees(None, miss) is False
    assert agrees(None, {"type": "cache_hit"}) is True
    assert agrees(None, {"cache_miss_reason": None}) is True
    assert agrees("model_changed", {"cache_miss_reason": None}) is False
    assert agrees("model_changed", {"type": "unavailable"}) is None
