"""proxy.pricing: the config's prices first, then LiteLLM's local cost map (looked
up once per model), else no price."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from canonicalize import Usage
from proxy.config import ConfigError, Price, load
from proxy.pricing import Pricing, cost, from_cost_map, saved

P = Price(input=3, cached_input=0.3, cache_write=3.75, output=15)


def test_cost_prices_each_kind_of_token_at_its_rate() -> None:
    usage = Usage(prompt=1100, cached=800, cache_write=200)
    assert cost(P, usage, 10) == pytest.approx((100 * 3 + 800 * 0.3 + 200 * 3.75 + 10 * 15) / 1e6)
    # 1-hour writes at 2x input.
    long = Usage(prompt=1100, cached=800, cache_write=200, cache_write_1h=150)
    assert cost(P, long, 10) == pytest.approx((100 * 3 + 800 * 0.3 + 50 * 3.75 + 150 * 6 + 10 * 15) / 1e6)


def test_saved_is_the_reads_saving_minus_the_writes_extra_cost() -> None:
    assert saved(P, Usage(prompt=1000, cached=800)) == pytest.approx(800 * 2.7 / 1e6)
    assert saved(P, Usage(prompt=1100, cached=800, cache_write=200)) == pytest.approx((800 * 2.7 - 200 * 0.75) / 1e6)
    both = Usage(prompt=1100, cached=800, cache_write=200, cache_write_1h=150)
    assert saved(P, both) == pytest.approx((800 * 2.7 - 50 * 0.75 - 150 * 3) / 1e6)
    # A request that only writes saved less than nothing.
    assert saved(P, Usage(prompt=1000, cached=0, cache_write=1000)) == pytest.approx(-1000 * 0.75 / 1e6)
    # No write surcharge (OpenAI): writes cost nothing extra.
    flat = Price(input=2, cached_input=0.5, cache_write=2, output=8)
    assert saved(flat, Usage(prompt=1000, cached=600, cache_write=400)) == pytest.approx(600 * 1.5 / 1e6)


def test_config_first_then_the_cost_map_once_per_model() -> None:
    calls = []

    def cost_map() -> Mapping[str, Any]:
        calls.append(1)
        return {
            "gpt-x": {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6, "cache_read_input_token_cost": 5e-7}
        }

    pricing = Pricing({"mine": P}, cost_map=cost_map)
    assert pricing.price("mine") is P and not calls
    found = pricing.price("openai/gpt-x")
    assert found == Price(input=2, cached_input=0.5, cache_write=2, output=8)
    assert pricing.price("nope") is None and pricing.known("nope") and pricing.known("openai/gpt-x")
    assert calls == [1]


def test_without_litellm_unknown_models_are_not_priced_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Once, at DEBUG: without the litellm extra this is every process's normal case."""
    pricing = Pricing({}, cost_map=lambda: None)
    with caplog.at_level(logging.DEBUG, logger="prefixpin"):
        assert pricing.price("a") is None and pricing.price("b") is None
    said = [r for r in caplog.records if r.message.startswith("litellm is not installed")]
    assert [(r.levelno, r.message) for r in said] == [
        (logging.DEBUG, "litellm is not installed: models not in provider_cache.prices are not priced")
    ]


def test_the_real_local_cost_map_knows_a_common_model() -> None:
    pytest.importorskip("litellm", reason="the litellm extra is not installed")
    price = Pricing({}).price("gpt-4o")
    assert price is not None and price.cached_input < price.input


def test_from_cost_map_needs_input_and_output() -> None:
    assert from_cost_map({"input_cost_per_token": 1e-6}) is None
    assert from_cost_map(None) is None


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ([], "provider_cache.prices: must be a mapping"),
        ({"m": {"input": 1}}, "provider_cache.prices.m.cached_input: is required"),
        ({"m": {**vars(P), "bogus": 1}}, "provider_cache.prices.m.bogus: unknown key"),
        ({"m": {**vars(P), "output": -1}}, "provider_cache.prices.m.output"),
    ],
)
def test_price_errors_name_the_key(prices: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, env={}, overrides={"provider_cache.prices": prices})


def test_provider_cache_enums() -> None:
    with pytest.raises(ConfigError, match=r"provider_cache\.prompt_cache_key: must be one of off, lineage"):
        load(None, env={}, overrides={"provider_cache.prompt_cache_key": "on"})
    assert load(None, env={}, overrides={"provider_cache.anthropic_breakpoints": False}).provider_cache == (
        load(None, env={}).provider_cache
    )  # YAML's bare `off`
    config = load(None, env={}, overrides={"provider_cache.prices": {"m": vars(P)}})
    assert config.public_dict()["provider_cache"]["prices"] == {"m": vars(P)}
