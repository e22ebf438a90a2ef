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
    assert c.listen.shutdown_grace_s == 30
    assert (c.limits.max_header_bytes, c.limits.max_decoded_bytes, c.limits.max_event_bytes) == (65536, 2**26, 2**23)


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
        ({"listen": {"port": 70000}}, "listen.port: must be a port number, 1-65535 (got 70000)"),
        ({"listen": {"shutdown_grace_s": -1}}, "listen.shutdown_grace_s: must be 0 or more seconds"),
        ({"upstream": {"url": "http://127.0.0.1:99999"}}, "upstream.url: the port must be a number, 1-65535"),
        ({"upstream": {"url": "http://h:x/"}}, "upstream.url: the port must be a number, 1-65535"),
        ({"upstream": {"url": "http://h:0/"}}, "upstream.url: the port must be a number, 1-65535"),
        ({"upstream": {"pool": ["http://a:1", "http://b:123456"]}}, "upstream.pool[1]: the port must be a number"),
        ({"upstream": {"url": "http://💩.example"}}, "upstream.url: the host '💩.example' has no IDNA (ASCII) form"),
        ({"limits": {"max_decoded_bytes": 0}}, "limits.max_decoded_bytes: must be greater than 0"),
        ({"limits": {"max_event_bytes": -5}}, "limits.max_event_bytes: must be greater than 0"),
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
