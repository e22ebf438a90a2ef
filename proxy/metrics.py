"""Every metric prefixpin exports, on a per-app registry (names: SPEC section 6).

Label values are bounded: ``model`` is the request's model only for models named
in ``metrics.models`` or among the first ``metrics.max_models`` the upstream
answered with a 2xx, else ``other``; rule names come from the loaded config; no label ever carries a
session, lineage, tenant or user value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry

from canonicalize import EXCHANGES, UNCACHED_CAUSES
from canonicalize.learn import CLASSES as LEARNED_CLASSES
from canonicalize.learn import REWRITES as LEARNED_REWRITES

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_OVERHEAD = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
_RATIO = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 1.0)

ROLES = ("root", "continuation", "fork", "bypass", "fail-open")
BREAK_CAUSES = ("system_changed", "tools_changed", "history_rewritten", "params_changed", "model_changed")
# The addons' names (proxy.addons) and the response state machine.
FAIL_OPEN_STAGES = (
    "bypass",
    "tenancy",
    "canonicalize",
    "store",
    "stream_usage",
    "fork_guard",
    "affinity",
    "measure",
    "record",
    "provider_cache",
    "response",
    "decode",
    "counting",
    "trace",
)
UPSTREAM_ERROR_KINDS = (
    "connect",
    "reset",
    "timeout",
    "tls",
    "proxy",
    "protocol",
    "encoding",
    "stream_cut",
    "other",
    "http_4xx",
    "http_5xx",
)
FORK_ACTIONS = ("repaired", "continued", "missing_parent", "disabled")
LINEAGE_REWRITES = ("lineage.tools", "fork.system", "fork.tools", "fork.params")
# prefixpin_cache_verdicts_total{agree}: our break cause against the provider's own diagnostics.
VERDICTS = ("yes", "no")


class _Children:
    """``labels()`` once per label set: prometheus_client checks the values, converts
    them and takes a lock on every call; our label values are bounded, so a family
    keeps the children it handed out and a request's metrics cost a dict lookup."""

    _children: dict[tuple[object, ...], Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._children = {}
        super().__init__(*args, **kwargs)

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Any:
        child = self._children.get(labelvalues) if not labelkwargs else None
        if child is None:
            child = super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc]
            if not labelkwargs:
                self._children[labelvalues] = child
        return child

    def remove(self, *labelvalues: Any) -> None:
        self._children.clear()
        super().remove(*labelvalues)  # type: ignore[misc]

    def clear(self) -> None:
        self._children.clear()
        super().clear()  # type: ignore[misc]


class Counter(_Children, prometheus_client.Counter):
    pass


class Histogram(_Children, prometheus_client.Histogram):
    pass


class Gauge(_Children, prometheus_client.Gauge):
    pass


class ModelLabels:
    """Maps model names to a bounded label set.

    A name takes one of the ``limit`` free slots only once the upstream answered a
    request for it with a 2xx: a client sending made-up names gets errors back, and
    its names count as ``other`` instead of crowding out the real models."""

    def __init__(self, named: Iterable[str] = (), limit: int = 50) -> None:
        self._named = frozenset(named)
        self._seen: set[str] = set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, model: object, *, answered: bool) -> str:
        """The label of ``model``; ``answered``: the upstream answered it with a 2xx."""
        if not isinstance(model, str) or not model:
            return "unknown"
        if model in self._named or model in self._seen:
            return model
        if not answered:
            return "other"
        with self._lock:
            if len(self._seen) < self._limit:
                self._seen.add(model)
                return model
        return "other"


class Metrics:
    """The metric families of one app."""

    def __init__(self, models: Iterable[str] = (), max_models: int = 50, rules: Iterable[str] = ()) -> None:
        # No ``*_created`` series: one per counter and histogram child, they doubled the
        # exposition and nothing reads them (rate() and increase() need no start time).
        # A process-wide switch of prometheus_client (multiprocess mode has none anyway).
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        models = tuple(models)
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.model_label = ModelLabels(models, max_models)
        self.requests = Counter("prefixpin_requests_total", "Requests handled", ("route", "role", "status"), registry=r)
        self.prompt_tokens = Counter(
            "prefixpin_prompt_tokens_total",
            "Prompt tokens reported by the upstream (cached included)",
            ("model", "role"),
            registry=r,
        )
        self.cached_tokens = Counter(
            "prefixpin_cached_tokens_total",
            "Prompt tokens the upstream served from its prefix cache",
            ("model", "role"),
            registry=r,
        )
        self.cache_write_tokens = Counter(
            "prefixpin_cache_write_tokens_total",
            "Prompt tokens the upstream wrote to its cache",
            ("model", "role"),
            registry=r,
        )
        self.rewrites = Counter("prefixpin_rewrites_total", "Requests changed, by rule", ("rule",), registry=r)
        self.forks = Counter("prefixpin_forks_total", "Fork handling, by action", ("action",), registry=r)
        self.blocked_tool_calls = Counter(
            "prefixpin_blocked_tool_calls_total", "Tool calls removed from fork responses", registry=r
        )
        self.prefix_breaks = Counter(
            "prefixpin_prefix_breaks_total",
            "Prefix breaks against the parent request, by cause",
            ("cause",),
            registry=r,
        )
        self.uncached_tokens = Counter(
            "prefixpin_uncached_tokens_total",
            "Prompt tokens the upstream did not serve from cache, by cause (new content, a prefix break, eviction)",
            ("cause",),
            registry=r,
        )
        self.fail_open = Counter(
            "prefixpin_fail_open_total",
            "Requests forwarded unchanged after an internal failure",
            ("stage",),
            registry=r,
        )
        self.upstream_errors = Counter(
            "prefixpin_upstream_errors_total", "Upstream failures, by kind", ("kind",), registry=r
        )
        self.replica_requests = Counter(
            "prefixpin_replica_requests_total", "Requests sent to each upstream.pool replica", ("replica",), registry=r
        )
        self.replica_failovers = Counter(
            "prefixpin_replica_failovers_total",
            "Requests sent to another replica after theirs refused the connection",
            registry=r,
        )
        self.request_duration = Histogram(
            "prefixpin_request_duration_seconds",
            "Request duration to the last byte",
            ("route",),
            buckets=_LATENCY,
            registry=r,
        )
        self.overhead = Histogram(
            "prefixpin_overhead_seconds",
            "Time prefixpin itself adds on the request path",
            buckets=_OVERHEAD,
            registry=r,
        )
        self.upstream_ttft = Histogram(
            "prefixpin_upstream_ttft_seconds",
            "Upstream time to first token (streamed) or to response",
            buckets=_LATENCY,
            registry=r,
        )
        self.predicted_prefix_ratio = Histogram(
            "prefixpin_predicted_prefix_ratio",
            "Share of the prompt identical to the parent request's prefix",
            buckets=_RATIO,
            registry=r,
        )
        self.cost_usd = Counter(
            "prefixpin_cost_usd_total",
            "What the requests cost at the model's prices (input, cached input, cache writes, output)",
            ("model",),
            registry=r,
        )
        # A sum that may go down (a cache write costs more than plain input), so not a
        # Counter: a gauge exported under the same sample name.  Workers' values add up.
        self.saved_usd = Gauge(
            "prefixpin_saved_usd_total",
            "USD the provider caches saved: cache reads x (input - cached input price) "
            "minus cache writes x (cache write - input price); may go down",
            ("model",),
            registry=r,
            multiprocess_mode="sum",
        )
        self.learned_spans = Counter(
            "prefixpin_learned_spans_total",
            "Changed spans of continuations' system text and tool descriptions, by class (canonicalize.learn)",
            ("class",),
            registry=r,
        )
        for cls in LEARNED_CLASSES:
            self.learned_spans.labels(cls)
        self.below_cache_minimum = Counter(
            "prefixpin_below_cache_minimum_total",
            "Answered requests whose stable prefix is shorter than the model's minimum cacheable prompt "
            "(provider_cache.min_tokens): the provider caches none of it",
            ("model",),
            registry=r,
        )
        self.cache_verdicts = Counter(
            "prefixpin_cache_verdicts_total",
            "Requests whose provider explained its cache result, by whether prefixpin's break cause agrees",
            ("agree",),
            registry=r,
        )
        for agree in VERDICTS:
            self.cache_verdicts.labels(agree)
        # Known label values exist from the start at zero: Prometheus cannot see the
        # first increment of a series that appears already holding it, so rate()
        # and alerts on a lone event would miss it.
        for cause in BREAK_CAUSES:
            self.prefix_breaks.labels(cause)
        for cause in UNCACHED_CAUSES:
            self.uncached_tokens.labels(cause)
        for stage in FAIL_OPEN_STAGES:
            self.fail_open.labels(stage)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)
        for action in FORK_ACTIONS:
            self.forks.labels(action)
        for rule in (*rules, *LINEAGE_REWRITES, *LEARNED_REWRITES):
            self.rewrites.labels(rule)
        for route in (exchange.name for exchange in EXCHANGES):
            for role in ROLES:
                self.requests.labels(route, role, "200")
        for model in models:
            for role in ROLES:
                for family in (self.prompt_tokens, self.cached_tokens, self.cache_write_tokens):
                    family.labels(model, role)
            self.cost_usd.labels(model)
            self.saved_usd.labels(model)
            self.below_cache_minimum.labels(model)
