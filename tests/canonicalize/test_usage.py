"""canonicalize.usage: prompt / cached / cache-write counts from every upstream shape.

One fixture per shape in ``fixtures/usage/``: ``kind`` is ``response`` (a whole
body) or ``stream`` (the parsed ``data:`` payloads, in order); ``expected`` is the
usage prefixpin must count, once.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from canonicalize import usage as usage_module
from canonicalize.usage import Usage, UsageAccumulator, parse_usage

FIXTURES = Path(__file__).parent / "fixtures" / "usage"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def expected(fixture: dict[str, Any]) -> Usage:
    e = fixture["expected"]
    return Usage(prompt=e["prompt"], cached=e["cached"], cache_write=e["cache_write"])


def accumulate(events: list[Any]) -> Usage | None:
    acc = UsageAccumulator()
    for event in events:
        acc.feed(event)
    return acc.result


def test_every_shape_has_a_fixture() -> None:
    assert set(NAMES) >= {
        "openai_nonstream",
        "openrouter_cache_write",
        "vllm_created_cache",
        "llamacpp_timings_only",
        "anthropic_nonstream",
        "anthropic_stream",
        "deepseek",
        "responses_api",
        "openai_stream_final_usage",
        "vllm_continuous_usage",
        "openai_chat_cache_write",
        "responses_cache_write",
        "responses_cache_write_stream",
        "mistral_num_cached",
        "mistral_stream",
        "xai_chat",
        "xai_responses",
        "gemini_openai_compat",
        "deepseek_stream",
    }


@pytest.mark.parametrize("name", [n for n in NAMES if load(n)["kind"] == "response"])
def test_response_usage(name: str) -> None:
    fixture = load(name)
    assert parse_usage(fixture["response"]) == expected(fixture)
    # A whole body fed to the accumulator counts the same.
    assert accumulate([fixture["response"]]) == expected(fixture)


@pytest.mark.parametrize("name", [n for n in NAMES if load(n)["kind"] == "stream"])
def test_stream_usage_is_counted_once(name: str) -> None:
    fixture = load(name)
    assert accumulate(fixture["events"]) == expected(fixture)


@pytest.mark.parametrize("name", [n for n in NAMES if load(n)["kind"] == "stream"])
def test_stream_usage_before_the_usage_event_is_none_or_partial(name: str) -> None:
    fixture = load(name)
    first = fixture["events"][0]
    result = accumulate([first])
    assert result is None or result.prompt <= expected(fixture).prompt


def test_anthropic_prompt_is_the_sum_of_its_three_parts() -> None:
    usage = parse_usage(
        {"type": "message", "usage": {"input_tokens": 3, "cache_read_input_tokens": 100, "output_tokens": 9}}
    )
    assert usage == Usage(prompt=103, cached=100, cache_write=0)
    usage = parse_usage({"usage": {"input_tokens": 50, "cache_creation_input_tokens": 2000}})
    assert usage == Usage(prompt=2050, cached=0, cache_write=2000)


def test_anthropic_stream_message_delta_does_not_double_count() -> None:
    events = load("anthropic_stream_cumulative")["events"]
    acc = UsageAccumulator()
    for event in events:
        acc.feed(event)
    once = acc.result
    # Feeding the message_delta again (as a retry or a proxy echo would) changes nothing.
    acc.feed(next(e for e in events if e["type"] == "message_delta"))
    assert acc.result == once == Usage(prompt=94061, cached=93801, cache_write=248)


def test_vllm_continuous_usage_reports_the_last_value() -> None:
    events = load("vllm_continuous_usage")["events"]
    acc = UsageAccumulator()
    for i, event in enumerate(events):
        acc.feed(event)
        assert acc.result == Usage(prompt=1024, cached=1008), i  # never summed


def test_later_values_replace_earlier_ones() -> None:
    acc = UsageAccumulator()
    acc.feed({"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}})
    acc.feed({"usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 8}}})
    assert acc.result == Usage(prompt=12, cached=8)


def test_a_result_read_between_events_follows_the_later_ones() -> None:
    # ``result`` is resolved once per event that brought counts: read, fed, read again.
    acc = UsageAccumulator()
    assert acc.result is None
    acc.feed({"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}})
    assert acc.result == Usage(prompt=10, cached=0)
    acc.feed({"choices": []})  # no counts: the same result
    assert acc.result == Usage(prompt=10, cached=0)
    acc.feed({"usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 8}}})
    assert acc.result == Usage(prompt=12, cached=8)


def test_responses_api_without_cached_details() -> None:
    assert parse_usage({"object": "response", "usage": {"input_tokens": 40, "output_tokens": 2}}) == Usage(40, 0)


def test_openai_usage_without_details_has_no_cached_tokens() -> None:
    assert parse_usage({"usage": {"prompt_tokens": 7, "completion_tokens": 1}}) == Usage(7, 0)


def test_llamacpp_details_win_over_timings() -> None:
    body = {
        "usage": {"prompt_tokens": 237, "prompt_tokens_details": {"cached_tokens": 200}},
        "timings": {"cache_n": 236, "prompt_n": 1},
    }
    assert parse_usage(body) == Usage(237, 200)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"usage": None},
        {"usage": {}},
        {"usage": {"completion_tokens": 5}},
        {"choices": [{"delta": {"content": "x"}}]},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
        {"usage": {"prompt_tokens": "12"}},
        {"usage": {"prompt_tokens": True}},
        {"timings": {"predicted_n": 3}},
    ],
)
def test_no_usage(body: dict[str, Any]) -> None:
    assert parse_usage(body) is None
    assert accumulate([body]) is None


@pytest.mark.parametrize("value", [None, [], "usage", 3])
def test_not_an_object(value: Any) -> None:
    assert parse_usage(value) is None
    assert accumulate([value]) is None


def test_float_counts_are_truncated_to_int() -> None:
    assert parse_usage({"usage": {"prompt_tokens": 12.0, "prompt_tokens_details": {"cached_tokens": 4.0}}}) == Usage(
        12, 4
    )


def test_completion_tokens_and_provider_diagnostics_are_kept() -> None:
    acc = UsageAccumulator()
    diag = {"cache_miss_reason": {"type": "system_changed"}}
    acc.feed(
        {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}, "diagnostics": diag}}
    )
    acc.feed({"type": "message_delta", "usage": {"output_tokens": 7}})
    assert (acc.completion, acc.diagnostics) == (7, diag)
    chat = UsageAccumulator()
    chat.feed({"usage": {"prompt_tokens": 9, "completion_tokens": 3}})
    assert (chat.completion, chat.diagnostics) == (3, None)
    responses = UsageAccumulator()
    pcd = {"type": "cache_miss", "reason": "input_changed", "cache_missed_tokens": 4}
    responses.feed({"type": "response.created", "response": {"id": "resp_7", "usage": None}})
    responses.feed(
        {
            "type": "response.completed",
            "response": {"id": "resp_7", "usage": {"input_tokens": 4}, "prompt_cache_diagnostics": pcd},
        }
    )
    assert responses.diagnostics == pcd and responses.result == Usage(4, 0)
    assert responses.message_id == "resp_7"  # the next turn's comparison_response_id
    whole = UsageAccumulator()
    whole.feed(load("responses_cache_write")["response"])
    assert whole.message_id == "resp_2" and whole.diagnostics["reason"] == "tools_changed"


def test_one_hour_writes_and_the_message_id() -> None:
    split = {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 900}
    usage = {"input_tokens": 5, "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 20}
    body = {"id": "msg_9", "type": "message", "usage": {**usage, "cache_creation": split}}
    assert parse_usage(body) == Usage(1025, 20, 1000, 900)
    whole = UsageAccumulator()
    whole.feed(body)
    assert (whole.result, whole.message_id) == (Usage(1025, 20, 1000, 900), "msg_9")
    stream = UsageAccumulator()
    stream.feed({"type": "message_start", "message": {"id": "msg_10", "usage": {**usage, "cache_creation": split}}})
    stream.feed({"type": "message_delta", "usage": {"output_tokens": 3}})
    assert (stream.result, stream.message_id) == (Usage(1025, 20, 1000, 900), "msg_10")
    # LiteLLM's OpenAI shape carries the split in prompt_tokens_details.
    details = {"cached_tokens": 20, "cache_creation_tokens": 1000, "cache_creation_token_details": split}
    litellm = {"prompt_tokens": 1025, "cache_creation_input_tokens": 1000, "prompt_tokens_details": details}
    assert parse_usage({"id": "chatcmpl-1", "usage": litellm}) == Usage(1025, 20, 1000, 900)
    chat = UsageAccumulator()
    chat.feed({"id": "chatcmpl-1", "object": "chat.completion", "usage": litellm})
    assert chat.message_id is None  # only Anthropic messages name one


def test_anthropic_writes_from_their_ttl_split_alone() -> None:
    split = {"ephemeral_5m_input_tokens": 300, "ephemeral_1h_input_tokens": 700}
    assert parse_usage({"usage": {"input_tokens": 5, "cache_creation": split}}) == Usage(1005, 0, 1000, 700)


def test_mistral_num_cached_tokens_and_openai_details_together() -> None:
    both = {"prompt_tokens": 100, "num_cached_tokens": 64, "prompt_tokens_details": {"cached_tokens": 80}}
    assert parse_usage({"usage": both}) == Usage(100, 80)  # OpenAI's field wins where both are sent
    spelled = {"prompt_tokens": 100, "prompt_token_details": {"cached_tokens": 32}}
    assert parse_usage({"usage": spelled}) == Usage(100, 32)


def _fields_every_path(obj: dict[str, Any]) -> dict[str, int]:
    """``usage._fields`` as it was, trying every path: the reference for the skip."""
    out: dict[str, int] = {}
    usage = obj.get("usage")
    if isinstance(usage, dict):
        for name, path in usage_module._PATHS:
            value = usage_module._int(usage, *path)
            if value is not None:
                out[name] = value
    return out


def test_fields_skip_absent_paths_randomized() -> None:
    rng = random.Random(15)
    keys = sorted({k for _, path in usage_module._PATHS for k in path})
    values: list[Any] = [None, 0, 7, 3.5, True, "9", [], {}]

    def node(depth: int) -> Any:
        if depth and rng.random() < 0.5:
            return {k: node(depth - 1) for k in rng.sample(keys, rng.randint(0, 5))}
        return rng.choice(values)

    for _ in range(2000):
        usage = node(2)
        obj = {"usage": usage}
        assert usage_module._fields(obj) == _fields_every_path(obj), usage


@pytest.mark.parametrize("order", [0, 1, 2])
def test_of_two_places_of_one_count_the_later_one_wins(order: int) -> None:
    """Where a usage object holds one count in several of the places known for it, the
    one listed later counts, whatever order the object's members come in."""
    places = [
        ("prompt_tokens_details", {"cache_write_tokens": 5, "cached_tokens": 40}),
        ("cache_write_tokens", 7),
        ("input_tokens_details", {"cache_write_tokens": 9}),
    ]
    members = [("prompt_tokens", 100), *places[order:], *places[:order]]
    assert parse_usage({"usage": dict(members)}) == Usage(100, 40, 9)
    assert parse_usage({"usage": dict(members[:1] + [p for p in members[1:] if p[0] != "input_tokens_details"])}) == (
        Usage(100, 40, 7)
    )
