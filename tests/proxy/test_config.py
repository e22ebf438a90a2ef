"""Config loading: defaults, file, environment, flags; errors name the key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxy.config import Config, ConfigError, from_mapping, load
from tests.infra.procs import REPO, prefixpin_argv


def test_defaults_match_spec() -> None:
    c = load(None, env={})
    assert (c.listen.host, c.listen.port) == ("127.0.0.1", 8787)
    assert c.store.backend == "memory"
    assert c.canonicalize.packs == ("generic", "hermes")
    assert c.fork.inherit_params == ("chat_template_kwargs", "reasoning_effort")
    assert c.fork.min_depth == 2 and c.fork.enabled and c.fork.guard_tools
    assert c.tenancy.trust_header is False and c.metrics.enabled is True


def test_example_config_is_valid_and_complete() -> None:
    c = load(REPO / "config.example.yaml", env={})
    assert c.canonicalize.rules[0].name == "my_clock"
    text = (REPO / "config.example.yaml").read_text()
    plain = Config().public_dict()
    for section, keys in plain.items():
        assert f"{section}:" in text
        for key in keys:
            assert f"{key}:" in text, f"config.example.yaml does not document {section}.{key}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"store": {"backend": "mongo"}}, "store.backend: must be one of memory, redis (got 'mongo')"),
        ({"store": {"bakend": "redis"}}, "store.bakend: unknown key"),
        ({"listen": {"port": "80"}}, "listen.port: must be an integer"),
        ({"listen": {"port": -1}}, "listen.port: must be greater than 0"),
        ({"upstream": {"url": "ftp://x"}}, "upstream.url: must be an http(s) URL"),
        ({"canonicalize": {"packs": ["nope"]}}, "canonicalize.packs: unknown pack(s) nope"),
        (
            {"canonicalize": {"rules": [{"name": "r", "pattern": "(", "action": "pin"}]}},
            "canonicalize.rules[0] (r): pattern does not compile",
        ),
        (
            {"canonicalize": {"rules": [{"name": "r", "pattern": "x", "action": "explode"}]}},
            "canonicalize.rules[0] (r): action must be one of",
        ),
        ({"canonicalize": {"rules": [{"name": "r", "action": "pin"}]}}, "canonicalize.rules[0].pattern: is required"),
        ({"fork": {"markers": ["["]}}, "fork.markers[0]: does not compile"),
        ({"fork": {"enabled": "yes"}}, "fork.enabled: must be true or false"),
        ({"metrics": 3}, "metrics: must be a mapping"),
        ({"bogus": {}}, "bogus: unknown key"),
        (
            {"provider_cache": {"anthropic_ttl": "24h"}},
            "provider_cache.anthropic_ttl: must be one of 5m, 1h, auto (got '24h')",
        ),
        (
            {"provider_cache": {"openai_retention": "1h"}},
            "provider_cache.openai_retention: must be one of off, 24h (got '1h')",
        ),
        (
            {"provider_cache": {"diagnostics": "always"}},
            "provider_cache.diagnostics: must be one of off, auto (got 'always')",
        ),
        (
            {
                "provider_cache": {
                    "prices": {"m": {"input": 1, "cached_input": 0, "cache_write": 1, "output": 1, "cache_write_1h": 2}}
                }
            },
            "provider_cache.prices.m.cache_write_1h: unknown key",
        ),
    ],
)
def test_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(data)
    assert message in str(info.value)


def test_provider_cache_keys_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("provider_cache: {anthropic_ttl: 1h, openai_retention: off, diagnostics: off}\n")
    pc = load(path, env={}).provider_cache  # YAML's bare off (false) is the word
    assert (pc.anthropic_ttl, pc.openai_retention, pc.diagnostics) == ("1h", "off", "off")
    path.write_text("provider_cache: {anthropic_ttl: auto, openai_retention: 24h, diagnostics: auto}\n")
    pc = load(path, env={}).provider_cache
    assert (pc.anthropic_ttl, pc.openai_retention, pc.diagnostics) == ("auto", "24h", "auto")
    assert Config().provider_cache.anthropic_ttl == "5m"


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("upstream: {url: 'http://file:1'}\nlisten: {port: 9000}\n")
    c = load(path, env={})
    assert c.upstream.url == "http://file:1" and c.listen.port == 9000
    c = load(path, env={"PREFIXPIN_UPSTREAM": "http://env:2", "PREFIXPIN_REDIS_URL": "redis://r:6379/1"})
    assert c.upstream.url == "http://env:2"
    assert (c.store.backend, c.store.redis_url) == ("redis", "redis://r:6379/1")
    c = load(None, env={"PREFIXPIN_CONFIG": str(path)}, overrides={"upstream.url": "http://flag:3"})
    assert c.upstream.url == "http://flag:3" and c.listen.port == 9000


def test_redis_password_is_hidden() -> None:
    c = from_mapping({"store": {"backend": "redis", "redis_url": "redis://user:s3cret@host:6379/0"}})
    assert "s3cret" not in repr(c)
    assert "s3cret" not in str(c.public_dict())


def test_check_config_cli(tmp_path: Path) -> None:
    good = subprocess.run(
        [*prefixpin_argv(), "check-config", str(REPO / "config.example.yaml")], capture_output=True, text=True
    )
    assert good.returncode == 0 and "packs:" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("store:\n  ttl_s: 0\n")
    out = subprocess.run([*prefixpin_argv(), "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "store.ttl_s: must be greater than 0" in out.stderr
    missing = subprocess.run(
        [*prefixpin_argv(), "check-config", str(tmp_path / "nope.yaml")], capture_output=True, text=True
    )
    assert missing.returncode != 0 and "cannot be read" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("listen: [\n")
    out = subprocess.run([*prefixpin_argv(), "serve", "--config", str(broken)], capture_output=True, text=True)
    assert out.returncode != 0 and "is not valid YAML" in out.stderr


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ({"redis_url": "redis://a:7000,b:7001/0"}, "store.redis_url: names one host"),
        (
            {"redis_url": "redis://a:7000/0?cluster=true"},
            "store.redis_url: ?cluster= is not read; set store.redis_mode",
        ),
        ({"redis_mode": "sentinel", "redis_url": "redis://s:26379"}, "store.sentinel_master: the master's name"),
        ({"redis_mode": "cluster", "redis_nodes": ["b:7001", "c"]}, "store.redis_nodes[1]: must be host:port"),
        ({"redis_nodes": ["b:7001"]}, "store.redis_nodes: only read with store.redis_mode: cluster or sentinel"),
        ({"sentinel_master": "m"}, "store.sentinel_master: only read with store.redis_mode: sentinel"),
        (
            {"redis_mode": "cluster", "redis_url": "redis://a:7000/3"},
            "store.redis_url: a Redis Cluster has only database 0",
        ),
        ({"redis_mode": "shards"}, "store.redis_mode: must be one of standalone, cluster, sentinel"),
        ({"redis_mode": "cluster", "redis_url": "unix:///run/redis.sock"}, "store.redis_url: a unix:// socket"),
    ],
)
def test_redis_topology_mistakes_are_named(store: dict[str, object], message: str) -> None:
    """What would crash serve at its start, or fail every request quietly, is a config error."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("?", r"\?")):
        from_mapping({"store": {"backend": "redis", **store}})


def test_redis_topologies_are_read() -> None:
    c = from_mapping(
        {
            "store": {
                "backend": "redis",
                "redis_url": "rediss://prefixpin:pw@s1:26379",
                "redis_mode": "sentinel",
                "redis_nodes": ["s2:26379", "[::1]:26379"],
                "sentinel_master": "pp",
            }
        }
    )
    assert (c.store.redis_mode, c.store.redis_nodes, c.store.sentinel_master) == (
        "sentinel",
        ("s2:26379", "[::1]:26379"),
        "pp",
    )
    assert "pw" not in repr(c)


def test_check_config_names_a_multi_host_url(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("store:\n  backend: redis\n  redis_url: redis://a:7000,b:7001/0\n")
    out = subprocess.run([*prefixpin_argv(), "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0 and "store.redis_url: names one host" in out.stderr
