"""What a request cost, and what its cached tokens saved, in USD.

Prices come from ``provider_cache.prices`` (USD per million tokens per model);
a model not listed there is looked up once in LiteLLM's *local* cost map (the
JSON file the installed ``litellm`` package ships, the one it loads itself with
``LITELLM_LOCAL_MODEL_COST_MAP=True``: never fetched from the network, and read
without importing LiteLLM, whose import costs seconds of CPU and a few hundred MB
of objects that every garbage collection would then scan), and the answer, found
or not, is cached per model.  Without LiteLLM installed, unlisted models are not
priced (said once in the log).

    cost  = uncached input x input + cached x cached_input
            + 5-minute cache writes x cache_write + 1-hour cache writes x 2 input
            + output x output
    saved = cached x (input - cached_input)                      the reads' saving
            - 5-minute cache writes x (cache_write - input)      minus the writes' extra cost
            - 1-hour cache writes x (2 input - input)

A cache write costs more than plain input (Anthropic: 1.25x for 5 minutes, 2x for
an hour), so a request that writes more than it reads saved less than nothing:
``saved`` may be negative.  Which writes were 1-hour ones, the usage says
(Anthropic's ``cache_creation.ephemeral_1h_input_tokens``); their price is 2x
input (:attr:`proxy.config.Price.cache_write_1h`).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from canonicalize import Usage
from proxy.config import Price

log = logging.getLogger("prefixpin")
PER = 1_000_000
MAX_LOOKUPS = 1024  # distinct model names whose LiteLLM lookup is remembered


COST_MAP_FILE = "model_prices_and_context_window_backup.json"


def _litellm_costs() -> Mapping[str, Any] | None:
    """LiteLLM's bundled cost map, or None when LiteLLM is not installed."""
    try:
        spec = importlib.util.find_spec("litellm")  # finds the package, runs none of it
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        path = Path(folder) / COST_MAP_FILE
        if path.is_file():
            costs = orjson.loads(path.read_bytes())
            return costs if isinstance(costs, dict) else None
    return None


def from_cost_map(entry: Any) -> Price | None:
    """A LiteLLM cost-map entry (USD per token) as a :class:`Price` (USD per 1M tokens)."""
    if not isinstance(entry, Mapping):
        return None
    per_token = entry.get("input_cost_per_token")
    output = entry.get("output_cost_per_token")
    if not isinstance(per_token, int | float) or not isinstance(output, int | float):
        return None
    cached = entry.get("cache_read_input_token_cost")
    write = entry.get("cache_creation_input_token_cost")
    return Price(
        input=per_token * PER,
        cached_input=(cached if isinstance(cached, int | float) else per_token) * PER,
        cache_write=(write if isinstance(write, int | float) else per_token) * PER,
        output=output * PER,
    )


class Pricing:
    """Prices by model: the config's first, then LiteLLM's local cost map."""

    def __init__(
        self,
        prices: Mapping[str, Price],
        *,
        cost_map: Callable[[], Mapping[str, Any] | None] = _litellm_costs,
    ) -> None:
        self._prices = dict(prices)
        self._load_map = cost_map
        self._map: Mapping[str, Any] | None = None
        self._loaded = False
        self._looked_up: dict[str, Price | None] = {}
        self._lock = threading.Lock()

    def known(self, model: str) -> bool:
        """True when :meth:`price` answers ``model`` without loading the cost map (an
        import of LiteLLM and a read of its file): a configured model, or any once the
        map is loaded (a lookup in it is a dict's)."""
        return self._loaded or model in self._prices or model in self._looked_up

    def price(self, model: object) -> Price | None:
        if not isinstance(model, str) or not model:
            return None
        if model in self._prices:
            return self._prices[model]
        with self._lock:
            if model in self._looked_up:
                return self._looked_up[model]
            found = self._lookup(model)
            if len(self._looked_up) < MAX_LOOKUPS:
                self._looked_up[model] = found
            return found

    @property
    def loaded(self) -> bool:
        """Is the cost map loaded (or known to be absent)?"""
        return self._loaded

    def load(self) -> None:
        """Load the cost map now (it may import LiteLLM: a worker thread's job); after
        it, :meth:`known` is true of every model."""
        with self._lock:
            self._load()

    def _load(self) -> None:
        if not self._loaded:  # (under the lock: loaded once; known() reads the flag once the map is set)
            self._map = self._load_map()
            self._loaded = True
            if self._map is None:
                # Said once, at DEBUG: without the litellm extra this is the normal case.
                log.debug("litellm is not installed: models not in provider_cache.prices are not priced")

    def _lookup(self, model: str) -> Price | None:
        self._load()
        if self._map is None:
            return None
        entry = self._map.get(model)
        if entry is None and "/" in model:  # "anthropic/claude-…" -> "claude-…"
            entry = self._map.get(model.split("/", 1)[1])
        return from_cost_map(entry)


def cost(price: Price, usage: Usage, completion: int) -> float:
    """USD for one request's ``usage`` and ``completion`` (output) tokens."""
    uncached = max(usage.prompt - usage.cached - usage.cache_write, 0)
    long = min(usage.cache_write_1h, usage.cache_write)
    return (
        uncached * price.input
        + usage.cached * price.cached_input
        + (usage.cache_write - long) * price.cache_write
        + long * price.cache_write_1h
        + completion * price.output
    ) / PER


def saved(price: Price, usage: Usage) -> float:
    """USD one request's cache use saved against no cache at all: its reads' saving
    (``input - cached_input`` each) minus its writes' extra cost (``cache_write -
    input`` each, ``cache_write_1h - input`` for 1-hour writes).  May be negative."""
    long = min(usage.cache_write_1h, usage.cache_write)
    reads = usage.cached * (price.input - price.cached_input)
    writes = (usage.cache_write - long) * (price.cache_write - price.input) + long * (
        price.cache_write_1h - price.input
    )
    return (reads - writes) / PER


__all__ = ["Pricing", "cost", "from_cost_map", "saved"]
