"""Configuration: a frozen dataclass tree, loaded once, validated loudly.

Precedence: built-in defaults < YAML file (``--config`` or ``PREFIXPIN_CONFIG``) <
environment (``PREFIXPIN_UPSTREAM``, ``PREFIXPIN_REDIS_URL``) < command-line
flags.  Every error names the key and the problem, e.g.
``store.backend: must be one of memory, redis (got 'mongo')``; one load reports
every problem it finds, not only the first.  Environment variables are read
here and nowhere else.  Secrets (a password in
``store.redis_url``) never appear in ``repr`` or in ``check-config`` output.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import parse_qs, urlsplit, urlunsplit

import yaml

from canonicalize import PACKS, ForkPolicy, RuleError, Settings, compile_rule
from canonicalize.ruleset import LearnMode
from proxy.hostnames import ascii_host
from proxy.redact import redact


class ConfigError(ValueError):
    """The configuration is invalid.  ``problems`` holds every problem found, each
    naming its key; ``str()`` is all of them, one a line."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


class _Problems:
    """Collects the problems of one load, so that it reports all of them: a check
    that raises ConfigError under :meth:`check` is noted and the load goes on."""

    def __init__(self) -> None:
        self.found: list[str] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            self.found.extend(exc.problems)

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError(*self.found)


def _hide_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8787
    workers: int = 1  # processes sharing the port and the store; 0 is "auto" (one per CPU, at most 8)
    shutdown_grace_s: float = 30.0  # on SIGTERM: requests in flight get this long, then streams are ended


@dataclass(frozen=True)
class Tls:
    """``upstream.tls``: how HTTPS upstreams are verified (proxy.upstream.tls)."""

    ca_file: str | None = None  # trust this CA bundle only (a private CA)
    verify: bool = True
    cert_file: str | None = None  # a client certificate (mutual TLS), PEM
    key_file: str | None = None  # its key, when not in cert_file


@dataclass(frozen=True)
class Upstream:
    url: str = field(default="http://127.0.0.1:8080", repr=False)  # may carry a password or a key
    kind: str = "openai"
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_connections: int = 512
    pool: tuple[str, ...] = field(default=(), repr=False)  # replicas of one model server; url unused when set
    tls: Tls = field(default_factory=Tls)
    # An egress proxy URL, "direct" for none; None: from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY.
    proxy: str | None = field(default=None, repr=False)  # may carry the proxy's credentials

    def __repr__(self) -> str:
        return (
            f"Upstream(url={redact(self.url)!r}, kind={self.kind!r}, timeout_s={self.timeout_s}, "
            f"connect_timeout_s={self.connect_timeout_s}, max_connections={self.max_connections}, "
            f"pool={[redact(u) for u in self.pool]!r}, tls={self.tls!r}, "
            f"proxy={redact(self.proxy) if self.proxy and self.proxy != 'direct' else self.proxy!r})"
        )

    @property
    def urls(self) -> tuple[str, ...]:
        """The replicas: the pool, or the one url."""
        return self.pool or (self.url,)


@dataclass(frozen=True)
class Affinity:
    """Section 2c: which replica (and llama-server slot) serves a lineage."""

    replicas: str = "lineage"  # lineage | round_robin (only used with upstream.pool)
    max_load: float = 1.25  # no replica takes more than this x the mean in-flight requests
    retry_after_s: float = 10.0  # a replica that refused connections is tried again after this
    # N > 0: pin each lineage to one of llama-server's N slots (id_slot); auto: N from its
    # /props; either way only where its /slots show that pinning keeps prompts (section 2c)
    llama_slots: int | Literal["auto"] = 0
    headers: tuple[str, ...] = ()  # request headers set to the lineage root id


@dataclass(frozen=True)
class Store:
    backend: str = "memory"
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    # standalone: redis_url is the server; cluster: one node of a Redis Cluster, redis_nodes
    # any others to start from; sentinel: one Sentinel, redis_nodes the others, and
    # sentinel_master the name of the master they watch (SPEC section 2g)
    redis_mode: str = "standalone"
    redis_nodes: tuple[str, ...] = ()
    sentinel_master: str | None = None
    ttl_s: int = 86400
    max_entries: int = 200_000
    max_bytes: int = 512 * 2**20
    # One tenant's share (a noisy neighbour evicts its own entries, not others'):
    tenant_max_entries: int = 50_000
    tenant_max_bytes: int = 128 * 2**20
    max_links_per_request: int = 256  # newest links recorded / looked up
    timeout_ms: int = 250

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={_hide_password(self.redis_url) if f.name == 'redis_url' else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"Store({shown})"


@dataclass(frozen=True)
class UserRule:
    name: str
    pattern: str
    action: str
    scope: str = "system"
    identity: bool = False
    replacement: str = "<masked>"


@dataclass(frozen=True)
class Canonicalize:
    packs: tuple[str, ...] = ("generic", "hermes")
    learn: str = "suggest"  # off | suggest | pin: volatile spans learned from traffic (SPEC section 2d)
    rules: tuple[UserRule, ...] = ()
    disable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fork:
    enabled: bool = True
    min_depth: int = 2
    markers: tuple[str, ...] = ()
    inherit_params: tuple[str, ...] = ("chat_template_kwargs", "reasoning_effort")
    guard_tools: bool = True


@dataclass(frozen=True)
class Tenancy:
    trust_header: bool = False
    credential_headers: tuple[str, ...] = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
    credential_params: tuple[str, ...] = ("key", "api_key", "api-key", "access_token")
    anonymous: str = "isolated"  # isolated | shared


@dataclass(frozen=True)
class Metrics:
    enabled: bool = True
    models: tuple[str, ...] = ()
    max_models: int = 50


@dataclass(frozen=True)
class Environment:
    """What the process environment says about reaching the upstream (read here, once):
    the egress proxies and the CA bundle every HTTP client honours.  Not config keys."""

    http_proxy: str | None = field(default=None, repr=False)
    https_proxy: str | None = field(default=None, repr=False)
    no_proxy: tuple[str, ...] = ()
    ssl_cert_file: str | None = None
    ssl_cert_dir: str | None = None
    # prometheus_client's multiprocess directory: set by the serve process for its workers
    # (proxy.workers); /metrics then sums every process's files.
    metrics_dir: str | None = None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Environment:
        def first(*names: str) -> str | None:
            return next((env[n].strip() for n in names if env.get(n, "").strip()), None)

        every = first("all_proxy", "ALL_PROXY")
        no_proxy = first("no_proxy", "NO_PROXY") or ""
        return cls(
            http_proxy=first("http_proxy", "HTTP_PROXY") or every,
            https_proxy=first("https_proxy", "HTTPS_PROXY") or every,
            no_proxy=tuple(p.strip() for p in no_proxy.split(",") if p.strip()),
            ssl_cert_file=first("SSL_CERT_FILE"),
            ssl_cert_dir=first("SSL_CERT_DIR"),
            metrics_dir=first("PROMETHEUS_MULTIPROC_DIR"),
        )


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024  # a request's line and headers (431 past it); an upstream response's (502)
    # Past either, the upstream's answer is relayed as it came, unread (fail open):
    max_decoded_bytes: int = 64 * 1024 * 1024  # an answer prefixpin reads whole, decoded
    max_event_bytes: int = 8 * 1024 * 1024  # one SSE event prefixpin parses
    # Open client connections; 0: from the file-descriptor limit (proxy.front.server).
    max_connections: int = 0
    keepalive_timeout_s: float = 5.0  # an idle client connection is closed after this
    # Bodies larger than this are forwarded as sent (no parse, no lineage): per-request
    # work stays bounded, and no single huge request stalls everyone else's.
    canonicalize_max_bytes: int = 4 * 1024 * 1024
    max_concurrency: int = 0  # 0: no limit
    header_timeout_s: float = 60.0  # request line + headers, from the head's first byte (before it: keepalive)
    body_timeout_s: float = 60.0  # the longest wait for the next piece of the body


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model.  ``cache_write`` is the 5-minute cache
    write; a 1-hour write costs :attr:`cache_write_1h`."""

    input: float
    cached_input: float
    cache_write: float
    output: float

    @property
    def cache_write_1h(self) -> float:
        """Anthropic's 1-hour cache write: 2x the input price (its published multiplier;
        not a price key: LiteLLM's cost map disagrees with it for a few models, one of
        them below the input price)."""
        return 2 * self.input


@dataclass(frozen=True)
class ProviderCache:
    prompt_cache_key: str = "off"  # off | lineage
    anthropic_breakpoints: str = "off"  # off | auto
    anthropic_ttl: str = "5m"  # 5m | 1h | auto: the TTL of the system+tools breakpoint prefixpin adds
    openai_retention: str = "off"  # off | 24h: prompt_cache_retention on chat and Responses requests
    diagnostics: str = "off"  # off | auto: Messages and Responses requests ask the provider why they missed
    openai_breakpoints: str = "off"  # off | auto: prompt_cache_breakpoint at the stable part's end (GPT-5.6+)
    # (model, tokens): the minimum cacheable prompt, over the built-in ones (canonicalize.minimums)
    min_tokens: tuple[tuple[str, int], ...] = ()
    prices: tuple[tuple[str, Price], ...] = ()  # (model, price); LiteLLM's cost map for the others

    def price_map(self) -> dict[str, Price]:
        return dict(self.prices)

    def min_token_map(self) -> dict[str, int]:
        return dict(self.min_tokens)


@dataclass(frozen=True)
class Trace:
    """``trace``: live traffic recorded as an audit trace (SPEC section 2h, proxy.recording)."""

    path: str | None = None  # the file appended to; None: nothing is recorded
    max_bytes: int = 256 * 2**20  # the file rotates when the next line would take it past this
    keep: int = 3  # rotated files kept (PATH.1 the newest); 0: the full file is removed


@dataclass(frozen=True)
class Log:
    level: str = "info"
    access: bool = False


@dataclass(frozen=True)
class Config:
    listen: Listen = field(default_factory=Listen)
    upstream: Upstream = field(default_factory=Upstream)
    affinity: Affinity = field(default_factory=Affinity)
    store: Store = field(default_factory=Store)
    canonicalize: Canonicalize = field(default_factory=Canonicalize)
    fork: Fork = field(default_factory=Fork)
    tenancy: Tenancy = field(default_factory=Tenancy)
    metrics: Metrics = field(default_factory=Metrics)
    limits: Limits = field(default_factory=Limits)
    log: Log = field(default_factory=Log)
    trace: Trace = field(default_factory=Trace)
    provider_cache: ProviderCache = field(default_factory=ProviderCache)
    environment: Environment = field(default_factory=Environment)  # not a config key: see Environment

    def settings(self) -> Settings:
        """The pure core's view of this config (compiled rules and fork policy)."""
        rules = []
        for i, r in enumerate(self.canonicalize.rules):
            try:
                rules.append(
                    compile_rule(r.name, r.pattern, r.action, r.scope, identity=r.identity, replacement=r.replacement)
                )
            except RuleError as exc:
                raise ConfigError(f"canonicalize.rules[{i}] ({r.name}): {exc}") from None
        return Settings(
            packs=self.canonicalize.packs,
            rules=tuple(rules),
            disabled=self.canonicalize.disable,
            learn=cast(LearnMode, self.canonicalize.learn),  # one of _ENUMS' (validated on load)
            fork=ForkPolicy(
                enabled=self.fork.enabled,
                min_depth=self.fork.min_depth,
                markers=tuple(re.compile(m) for m in self.fork.markers),
                inherit_params=self.fork.inherit_params,
                guard_tools=self.fork.guard_tools,
            ),
        )

    def public_dict(self) -> dict[str, Any]:
        """The effective config as plain data, secrets hidden (for check-config)."""
        out: dict[str, Any] = _to_plain(self)
        out["store"]["redis_url"] = _hide_password(self.store.redis_url)
        out["upstream"]["url"] = redact(self.upstream.url)
        out["upstream"]["pool"] = [redact(u) for u in self.upstream.pool]
        proxy = self.upstream.proxy
        out["upstream"]["proxy"] = redact(proxy) if proxy and proxy != "direct" else proxy
        del out["environment"]
        out["provider_cache"]["prices"] = {m: _to_plain(p) for m, p in self.provider_cache.prices}
        out["provider_cache"]["min_tokens"] = self.provider_cache.min_token_map()
        if not self.listen.workers:
            out["listen"]["workers"] = "auto"
        return out


def _to_plain(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [_to_plain(v) for v in obj]
    return obj


# -- loading ------------------------------------------------------------------

_ENUMS = {
    "upstream.kind": ("openai", "litellm"),
    "store.backend": ("memory", "redis"),
    "store.redis_mode": ("standalone", "cluster", "sentinel"),
    "log.level": ("debug", "info", "warning", "error"),
    "tenancy.anonymous": ("isolated", "shared"),
    "affinity.replicas": ("lineage", "round_robin"),
    "provider_cache.prompt_cache_key": ("off", "lineage"),
    "provider_cache.anthropic_breakpoints": ("off", "auto"),
    "provider_cache.anthropic_ttl": ("5m", "1h", "auto"),
    "provider_cache.openai_retention": ("off", "24h"),
    "provider_cache.diagnostics": ("off", "auto"),
    "provider_cache.openai_breakpoints": ("off", "auto"),
    "canonicalize.learn": ("off", "suggest", "pin"),
}
_POSITIVE = {
    "listen.port",
    "upstream.timeout_s",
    "upstream.connect_timeout_s",
    "upstream.max_connections",
    "store.ttl_s",
    "store.max_entries",
    "store.max_bytes",
    "store.tenant_max_entries",
    "store.tenant_max_bytes",
    "store.max_links_per_request",
    "store.timeout_ms",
    "limits.max_body_bytes",
    "limits.canonicalize_max_bytes",
    "limits.header_timeout_s",
    "limits.body_timeout_s",
    "limits.max_header_bytes",
    "limits.max_decoded_bytes",
    "limits.max_event_bytes",
    "limits.keepalive_timeout_s",
    "metrics.max_models",
    "affinity.max_load",
    "affinity.retry_after_s",
    "trace.max_bytes",
}


# YAML 1.1 reads a bare ``off`` as false: these keys take it as the word.
_OFF_WORDS = {
    "provider_cache.prompt_cache_key",
    "provider_cache.anthropic_breakpoints",
    "provider_cache.openai_retention",
    "provider_cache.diagnostics",
    "provider_cache.openai_breakpoints",
    "canonicalize.learn",
}


def _check_scalar(key: str, value: Any, default: Any) -> Any:
    if key in _OFF_WORDS and value is False:
        value = "off"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false (got {value!r})")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer (got {value!r})")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number (got {value!r})")
        value = float(value)
    elif isinstance(default, str) and (not isinstance(value, str) or not value):
        raise ConfigError(f"{key}: must be a non-empty string (got {value!r})")
    if key in _POSITIVE and value <= 0:
        raise ConfigError(f"{key}: must be greater than 0 (got {value!r})")
    if key in _ENUMS and value not in _ENUMS[key]:
        raise ConfigError(f"{key}: must be one of {', '.join(_ENUMS[key])} (got {value!r})")
    return value


def _str_list(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: must be a list of strings (got {value!r})")
    return tuple(value)


def _rules(value: Any) -> tuple[UserRule, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"canonicalize.rules: must be a list of rules (got {value!r})")
    out = []
    problems = _Problems()
    for i, item in enumerate(value):
        with problems.check():
            out.append(_rule(f"canonicalize.rules[{i}]", item))
    names = [r.name for r in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        problems.found.append(f"canonicalize.rules: duplicate rule name(s): {', '.join(sorted(dup))}")
    problems.raise_any()
    return tuple(out)


def _rule(key: str, item: Any) -> UserRule:
    """One user rule, compiled once to check it."""
    known = {f.name for f in fields(UserRule)}
    if not isinstance(item, Mapping):
        raise ConfigError(f"{key}: must be a mapping with name, pattern, action (got {item!r})")
    problems = _Problems()
    for k in item:
        if k not in known:
            problems.found.append(f"{key}.{k}: unknown key (known: {', '.join(sorted(known))})")
    for required in ("name", "pattern", "action"):
        if not isinstance(item.get(required), str) or not item.get(required):
            problems.found.append(f"{key}.{required}: is required and must be a non-empty string")
    problems.raise_any()
    rule = UserRule(**dict(item))
    try:
        compile_rule(
            rule.name,
            rule.pattern,
            rule.action,
            rule.scope,
            identity=bool(rule.identity),
            replacement=str(rule.replacement),
        )
    except RuleError as exc:
        raise ConfigError(f"{key} ({rule.name}): {exc}") from None
    return rule


def _prices(value: Any) -> tuple[tuple[str, Price], ...]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"provider_cache.prices: must be a mapping of model to prices (got {value!r})")
    out = []
    problems = _Problems()
    for model, item in value.items():
        with problems.check():
            out.append((model, _price(model, item)))
    problems.raise_any()
    return tuple(out)


def _min_tokens(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"provider_cache.min_tokens: must be a mapping of model to tokens (got {value!r})")
    out = []
    for model, tokens in value.items():
        if not isinstance(model, str) or not model:
            raise ConfigError(f"provider_cache.min_tokens: model names must be non-empty strings (got {model!r})")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ConfigError(
                f"provider_cache.min_tokens.{model}: must be a whole number of tokens, 0 or more (got {tokens!r})"
            )
        out.append((model, tokens))
    return tuple(out)


def _price(model: Any, item: Any) -> Price:
    names = [f.name for f in fields(Price)]
    key = f"provider_cache.prices.{model}"
    if not isinstance(model, str) or not model:
        raise ConfigError(f"provider_cache.prices: model names must be non-empty strings (got {model!r})")
    if not isinstance(item, Mapping):
        raise ConfigError(f"{key}: must be a mapping with {', '.join(names)} (got {item!r})")
    problems = _Problems()
    for k in item:
        if k not in names:
            problems.found.append(f"{key}.{k}: unknown key (known: {', '.join(names)})")
    numbers = {}
    for name in names:
        v = item.get(name)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            problems.found.append(f"{key}.{name}: is required, USD per million tokens, 0 or more (got {v!r})")
        else:
            numbers[name] = float(v)
    problems.raise_any()
    return Price(**numbers)


def _section(name: str, cls: Any, data: Any, problems: _Problems) -> Any:
    """The section ``name`` from ``data``; each key's problem goes to ``problems``
    and that key keeps its default (so that the cross-field checks still run)."""
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        problems.found.append(f"{name}: must be a mapping (got {data!r})")
        return cls()
    defaults = cls()
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{name}.{k}"
        if k not in known:
            problems.found.append(f"{key}: unknown key (known: {', '.join(known)})")
            continue
        default = getattr(defaults, k)
        if is_dataclass(default):
            values[k] = _section(key, type(default), v, problems)
            continue
        with problems.check():
            values[k] = _value(key, v, default)
    return replace(defaults, **values)


def _value(key: str, value: Any, default: Any) -> Any:
    """One key's value, checked (ConfigError naming the key)."""
    special: Callable[[Any], Any] | None = _SPECIAL.get(key)
    if special is not None:
        return special(value)
    if key in _OPTIONAL_STR:
        return _optional_str(key, value)
    if isinstance(default, tuple):
        return _str_list(key, value)
    return _check_scalar(key, value, default)


# Keys whose default is null: a non-empty string or null.
_OPTIONAL_STR = {
    "upstream.tls.ca_file",
    "upstream.tls.cert_file",
    "upstream.tls.key_file",
    "upstream.proxy",
    "trace.path",
}


def _optional_str(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: must be a non-empty string or null (got {value!r})")
    return value.strip()


def _workers(value: Any) -> int:
    """``auto`` (0) or a count; the command line gives strings."""
    if value == "auto":
        return 0
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 256:
        raise ConfigError(f"listen.workers: must be auto or a number of processes, 1-256 (got {value!r})")
    return value


def _llama_slots(value: Any) -> int | Literal["auto"]:
    """``auto``, 0 (off) or a slot count."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"affinity.llama_slots: must be auto, 0 (off) or a number of slots (got {value!r})")
    return value


# Keys with a reader of their own (the rest: by their default's type).
_SPECIAL: dict[str, Callable[[Any], Any]] = {
    "canonicalize.rules": _rules,
    "listen.workers": _workers,
    "affinity.llama_slots": _llama_slots,
    "provider_cache.prices": _prices,
    "provider_cache.min_tokens": _min_tokens,
}


def from_mapping(data: Any, environment: Environment | None = None) -> Config:
    """Build and validate a Config from parsed YAML (or any mapping)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: the top level must be a mapping (got {type(data).__name__})")
    sections = {f.name: f for f in fields(Config) if f.name != "environment"}
    values: dict[str, Any] = {}
    problems = _Problems()
    for k, v in data.items():
        if k not in sections:
            problems.found.append(f"{k}: unknown key (known: {', '.join(sections)})")
            continue
        values[k] = _section(k, sections[k].default_factory, v, problems)
    config = Config(**values, environment=environment or Environment())
    with problems.check():
        validate(config)
    problems.raise_any()
    return config


def validate(config: Config) -> None:
    """Cross-field checks, shared by every way a Config is built: every check runs,
    and one ConfigError lists what they found."""
    problems = _Problems()
    for check in _CHECKS:
        with problems.check():
            check(config)
    problems.raise_any()


def _validate_packs(config: Config) -> None:
    unknown = [p for p in config.canonicalize.packs if p not in PACKS]
    if unknown:
        raise ConfigError(f"canonicalize.packs: unknown pack(s) {', '.join(unknown)} (built-in: {', '.join(PACKS)})")


def _validate_fork(config: Config) -> None:
    problems = _Problems()
    for i, m in enumerate(config.fork.markers):
        try:
            re.compile(m)
        except re.error as exc:
            problems.found.append(f"fork.markers[{i}]: does not compile: {exc}")
    if config.fork.min_depth < 1:
        problems.found.append(f"fork.min_depth: must be at least 1 (got {config.fork.min_depth})")
    problems.raise_any()


def _validate_limits(config: Config) -> None:
    if config.limits.max_concurrency < 0:
        raise ConfigError(f"limits.max_concurrency: must be 0 (no limit) or more (got {config.limits.max_concurrency})")


def _validate_listen(config: Config) -> None:
    problems = _Problems()
    if not 1 <= config.listen.port <= 65535:
        problems.found.append(f"listen.port: must be a port number, 1-65535 (got {config.listen.port})")
    if config.listen.shutdown_grace_s < 0:
        problems.found.append(
            f"listen.shutdown_grace_s: must be 0 or more seconds (got {config.listen.shutdown_grace_s})"
        )
    problems.raise_any()


def _validate_upstream(config: Config) -> None:
    _validate_url("upstream.url", config.upstream.url)


def _validate_store(config: Config) -> None:
    if config.store.backend == "redis":
        _validate_redis(config.store)


def _validate_rules(config: Config) -> None:
    problems = _Problems()
    for i, r in enumerate(config.canonicalize.rules):
        try:
            compile_rule(r.name, r.pattern, r.action, r.scope, identity=r.identity, replacement=r.replacement)
        except RuleError as exc:
            problems.found.append(f"canonicalize.rules[{i}] ({r.name}): {exc}")
    problems.raise_any()


def _validate_redis(store: Store) -> None:
    """The Redis topology's keys agree with each other (SPEC section 2g): what would
    otherwise fail at ``serve``'s start, or quietly fail every request, is named here
    (every mistake at once)."""
    problems = _Problems()
    found = problems.found
    url = urlsplit(store.redis_url)
    if url.scheme not in ("redis", "rediss", "unix"):
        found.append("store.redis_url: must be a redis://, rediss:// or unix:// URL")
    if url.scheme != "unix" and "," in url.netloc:
        found.append(
            "store.redis_url: names one host; list a cluster's other nodes or the other Sentinels "
            "in store.redis_nodes (with store.redis_mode: cluster or sentinel)"
        )
    if "cluster" in {k.lower() for k in parse_qs(url.query)}:
        found.append("store.redis_url: ?cluster= is not read; set store.redis_mode: cluster")
    mode = store.redis_mode
    if mode != "standalone" and url.scheme == "unix":
        found.append(f"store.redis_url: a unix:// socket is one standalone server, not a {mode}")
    for i, node in enumerate(store.redis_nodes):
        if not _HOST_PORT.fullmatch(node):
            found.append(f"store.redis_nodes[{i}]: must be host:port (got {node!r})")
    if store.redis_nodes and mode == "standalone":
        found.append("store.redis_nodes: only read with store.redis_mode: cluster or sentinel")
    if mode == "sentinel" and not store.sentinel_master:
        found.append("store.sentinel_master: the master's name is required with store.redis_mode: sentinel")
    if mode != "sentinel" and store.sentinel_master:
        found.append("store.sentinel_master: only read with store.redis_mode: sentinel")
    if mode == "cluster" and url.path not in ("", "/", "/0"):
        found.append(f"store.redis_url: a Redis Cluster has only database 0 (got {url.path!r})")
    problems.raise_any()


_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _validate_tenancy(config: Config) -> None:
    problems = _Problems()
    for i, name in enumerate(config.tenancy.credential_headers):
        if not _TOKEN.fullmatch(name):
            problems.found.append(f"tenancy.credential_headers[{i}]: not a header name (got {name!r})")
    for i, name in enumerate(config.tenancy.credential_params):
        if not name:
            problems.found.append(f"tenancy.credential_params[{i}]: must be a non-empty string")
    problems.raise_any()


def _validate_tenant_bounds(config: Config) -> None:
    store = config.store
    if store.tenant_max_entries <= store.max_links_per_request:
        raise ConfigError(
            f"store.tenant_max_entries: must be more than store.max_links_per_request "
            f"({store.max_links_per_request}), or one request could evict its own lineage "
            f"(got {store.tenant_max_entries})"
        )


def _validate_url(key: str, url: str) -> None:
    """An upstream URL prefixpin can connect to: http(s), a host with an ASCII form, a port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: must be an http(s) URL (got {redact(url)!r})")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ConfigError(f"{key}: the port must be a number, 1-65535 (got {redact(url)!r})")
    try:
        ascii_host(parts.hostname)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _validate_not_itself(config: Config) -> None:
    """No upstream is prefixpin's own listening address: each request would be
    forwarded to itself until the client gave up (the same host and port, where a
    listener on 0.0.0.0 or :: is reached by every local address).  Not judged where an
    egress proxy may carry the request (it resolves the name, on its own host)."""
    problems = _Problems()
    listen, env, egress = config.listen, config.environment, config.upstream.proxy
    own = _local_names(listen.host)
    for key, url in _upstream_urls(config):
        parts = urlsplit(url)
        if egress_for(parts.scheme, egress, env) is not None:
            continue
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue  # named by _validate_url
        host = (parts.hostname or "").lower()
        if port == listen.port and (host in own or (own is _ANY_LOCAL and _is_local(host))):
            problems.found.append(
                f"{key}: is prefixpin's own address (listen {listen.host}:{listen.port}); every request "
                f"would be forwarded to itself: point it at the model server (got {redact(url)!r})"
            )
    problems.raise_any()


def egress_for(scheme: str, configured: str | None, env: Environment) -> str | None:
    """The egress proxy URL an upstream of ``scheme`` is reached through before
    ``NO_PROXY`` is read (None: directly): ``upstream.proxy`` (``configured``; "direct"
    for none), else ``HTTPS_PROXY`` or ``HTTP_PROXY`` (``ALL_PROXY``) by the scheme."""
    if configured is not None:
        return None if configured == "direct" else configured
    return env.https_proxy if scheme == "https" else env.http_proxy


def _upstream_urls(config: Config) -> list[tuple[str, str]]:
    pool = config.upstream.pool
    return [(f"upstream.pool[{i}]", u) for i, u in enumerate(pool)] if pool else [("upstream.url", config.upstream.url)]


_ANY_LOCAL = frozenset({"0.0.0.0", "::", ""})  # a listener there accepts on every local address


def _local_names(host: str) -> frozenset[str]:
    """The host names an upstream URL may give for the listen host."""
    host = host.lower().strip("[]")
    if host in _ANY_LOCAL:
        return _ANY_LOCAL
    if host in ("localhost", "127.0.0.1", "::1"):  # connecting to 0.0.0.0 or :: reaches loopback too
        addresses = {"127.0.0.1", "::1"} if host == "localhost" else {host}
        return frozenset({*addresses, "localhost", "0.0.0.0", "::"})
    return frozenset({host})


def _is_local(host: str) -> bool:
    """A host that names this machine without a lookup: localhost, a loopback or
    unspecified address."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _validate_affinity(config: Config) -> None:
    problems = _Problems()
    for i, u in enumerate(config.upstream.pool):
        with problems.check():
            _validate_url(f"upstream.pool[{i}]", u)
    a = config.affinity
    if a.max_load < 1:
        problems.found.append(f"affinity.max_load: must be at least 1 (got {a.max_load})")
    if config.listen.workers > 1 and config.store.backend != "redis":
        problems.found.append(
            f"listen.workers: {config.listen.workers} processes share lineages through Redis: set store.backend: "
            "redis (or PREFIXPIN_REDIS_URL); with the memory store each would have its own"
        )
    if a.llama_slots and config.listen.workers > 1:
        problems.found.append(
            f"listen.workers: must be 1 (or auto) with affinity.llama_slots: one process assigns the slots "
            f"(got {config.listen.workers})"
        )
    for i, name in enumerate(a.headers):
        if not _TOKEN.fullmatch(name):
            problems.found.append(f"affinity.headers[{i}]: not a header name (got {name!r})")
    problems.raise_any()


def _validate_trace(config: Config) -> None:
    """The trace's directory exists; whether it can be written is found out when it is
    (a failed write is counted, never a failed request: proxy.recording)."""
    t = config.trace
    if t.keep < 0:
        raise ConfigError(f"trace.keep: must be 0 or more rotated files (got {t.keep})")
    if t.path is None:
        return
    directory = Path(t.path).expanduser().parent
    if not directory.is_dir():
        raise ConfigError(f"trace.path: the directory {str(directory)!r} does not exist")
    if Path(t.path).expanduser().is_dir():
        raise ConfigError(f"trace.path: {t.path!r} is a directory, not a file")


def _validate_tls(config: Config) -> None:
    """The TLS files load (the first that does not is the problem: the next ones depend on it)."""
    tls = config.upstream.tls
    for key, path in (("ca_file", tls.ca_file), ("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"upstream.tls.{key}: cannot read {path!r}")
    if tls.key_file and not tls.cert_file:
        raise ConfigError("upstream.tls.key_file: needs upstream.tls.cert_file (the certificate it is the key of)")
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if tls.ca_file:
            ctx.load_verify_locations(cafile=tls.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"upstream.tls.ca_file: not a PEM CA bundle ({exc})") from None
    try:
        if tls.cert_file:
            ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"upstream.tls.cert_file: the certificate and key do not load ({exc})") from None


def _validate_proxies(config: Config) -> None:
    """The egress proxy URLs (configured, or from the environment) are ones prefixpin can use."""
    env = config.environment
    problems = _Problems()
    for key, url in (
        ("upstream.proxy", None if config.upstream.proxy == "direct" else config.upstream.proxy),
        ("HTTPS_PROXY (environment)", env.https_proxy),
        ("HTTP_PROXY (environment)", env.http_proxy),
    ):
        if url is not None:
            with problems.check():
                _check_proxy(key, url)
    problems.raise_any()


def _check_proxy(key: str, url: str) -> None:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(f"{key}: {parts.scheme}:// proxies are not supported (use an http:// or https:// proxy)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ConfigError(f"{key}: the port is not a number ({redact(url)})") from None
    if not parts.hostname:
        raise ConfigError(f"{key}: the proxy URL names no host ({redact(url)})")


# validate()'s checks, in the order their problems are listed.
_CHECKS: tuple[Callable[[Config], None], ...] = (
    _validate_packs,
    _validate_fork,
    _validate_listen,
    _validate_limits,
    _validate_tenancy,
    _validate_tenant_bounds,
    _validate_upstream,
    _validate_affinity,
    _validate_not_itself,
    _validate_tls,
    _validate_proxies,
    _validate_store,
    _validate_trace,
    _validate_rules,
)


def config_file(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> str | os.PathLike[str] | None:
    """The file :func:`load` reads: ``path``, else ``$PREFIXPIN_CONFIG``, else none."""
    env = os.environ if env is None else env
    return path or env.get("PREFIXPIN_CONFIG") or None


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's YAML as a mapping (ConfigError naming the file, and the line
    for a YAML error)."""
    name = repr(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {name}: cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {name}: is not UTF-8 text (byte {exc.start})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = ": ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"config file {name}{where}: is not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {name}: is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, Mapping):
        raise ConfigError(f"config file {name}: the top level must be a mapping (got {type(loaded).__name__})")
    return dict(loaded or {})


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults < file < environment < ``overrides`` (dotted keys, from the CLI)."""
    env = os.environ if env is None else env
    path = config_file(path, env=env)
    data = read_file(path) if path else {}
    dotted: dict[str, Any] = {}
    if env.get("PREFIXPIN_UPSTREAM"):
        dotted["upstream.url"] = env["PREFIXPIN_UPSTREAM"]
    if env.get("PREFIXPIN_REDIS_URL"):
        dotted["store.redis_url"] = env["PREFIXPIN_REDIS_URL"]
        dotted["store.backend"] = "redis"
    dotted.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key, value in dotted.items():
        section, _, name = key.partition(".")
        current = data.get(section)
        data[section] = {**(current if isinstance(current, Mapping) else {}), name: value}
    return from_mapping(data, Environment.read(env))
