"""Config loading: defaults, file, environment, flags; errors name the key."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from proxy.cli import build_parser
from proxy.config import Config, ConfigError, Environment, from_mapping, load
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


def test_example_config_is_the_defaults_and_complete() -> None:
    """Copying config.example.yaml changes nothing: it holds the defaults, and shows
    the user rule it documents only as a comment."""
    c = load(REPO / "config.example.yaml", env={})
    assert c == load(None, env={})
    text = (REPO / "config.example.yaml").read_text()
    plain = Config().public_dict()
    for section, keys in plain.items():
        assert f"{section}:" in text
        for key in keys:
            assert f"{key}:" in text, f"config.example.yaml does not document {section}.{key}"


def test_example_configs_commented_rule_is_valid() -> None:
    lines = (REPO / "config.example.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  # - name: my_clock"))
    block = []
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append(line[4:])
    rules = from_mapping({"canonicalize": {"rules": yaml.safe_load("\n".join(block))}}).canonicalize.rules
    assert [(r.name, r.action, r.scope) for r in rules] == [("my_clock", "pin", "system")]


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
        (
            {"provider_cache": {"openai_breakpoints": "on"}},
            "provider_cache.openai_breakpoints: must be one of off, auto (got 'on')",
        ),
        ({"provider_cache": {"min_tokens": [1024]}}, "provider_cache.min_tokens: must be a mapping of model to tokens"),
        (
            {"provider_cache": {"min_tokens": {"m": -1}}},
            "provider_cache.min_tokens.m: must be a whole number of tokens, 0 or more (got -1)",
        ),
        ({"provider_cache": {"min_tokens": {"m": 1.5}}}, "provider_cache.min_tokens.m: must be a whole number"),
        ({"provider_cache": {"min_tokens": {"m": True}}}, "provider_cache.min_tokens.m: must be a whole number"),
        (
            {"trace": {"path": "/nonexistent-dir/t.jsonl"}},
            "trace.path: the directory '/nonexistent-dir' does not exist",
        ),
        ({"trace": {"path": "/tmp"}}, "trace.path: '/tmp' is a directory, not a file"),
        ({"trace": {"path": ""}}, "trace.path: must be a non-empty string or null"),
        ({"trace": {"max_bytes": 0}}, "trace.max_bytes: must be greater than 0"),
        ({"trace": {"keep": -1}}, "trace.keep: must be 0 or more rotated files (got -1)"),
    ],
)
def test_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(data)
    assert message in str(info.value)


SELF = "is prefixpin's own address"


@pytest.mark.parametrize(
    ("listen", "upstream"),
    [
        ({}, {"url": "http://127.0.0.1:8787"}),
        ({}, {"url": "http://localhost:8787/v1"}),
        ({}, {"url": "http://LOCALHOST:8787"}),
        ({}, {"url": "http://0.0.0.0:8787"}),
        ({"port": 80}, {"url": "http://127.0.0.1"}),
        ({"port": 443}, {"url": "https://localhost/"}),
        ({"host": "0.0.0.0"}, {"url": "http://127.0.0.2:8787"}),
        ({"host": "0.0.0.0"}, {"url": "http://[::1]:8787"}),
        ({"host": "::"}, {"url": "http://app.localhost:8787"}),
        ({"host": "::1"}, {"url": "http://[::1]:8787"}),
        ({"host": "localhost"}, {"url": "http://[::1]:8787"}),
        ({}, {"url": "http://localhost:8787", "proxy": "direct"}),
        ({"host": "10.1.2.3", "port": 9000}, {"url": "http://10.1.2.3:9000"}),
        ({}, {"pool": ["http://127.0.0.1:8080", "http://localhost:8787"]}),
    ],
)
def test_an_upstream_that_is_prefixpin_itself_is_refused(
    listen: dict[str, object], upstream: dict[str, object]
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({"listen": listen, "upstream": upstream})
    key = "upstream.pool[1]" if "pool" in upstream else "upstream.url"
    assert f"{key}: {SELF}" in str(info.value) and "every request would be forwarded to itself" in str(info.value)


@pytest.mark.parametrize(
    ("listen", "upstream"),
    [
        ({}, {"url": "http://127.0.0.1:8080"}),
        ({}, {"url": "http://127.0.0.2:8787"}),  # another loopback address than the one listened on
        ({}, {"url": "http://10.1.2.3:8787"}),
        ({}, {"url": "https://127.0.0.1"}),  # port 443
        ({"host": "10.1.2.3"}, {"url": "http://10.1.2.4:8787"}),
        ({"host": "0.0.0.0"}, {"url": "http://model.internal:8787"}),  # no lookup: another machine by name
        ({"port": 9000}, {"url": "http://localhost:8787"}),
        ({}, {"url": "http://[::1]:8787"}),  # listening on 127.0.0.1 only
        ({}, {"url": "http://localhost:8787", "proxy": "http://proxy.internal:3128"}),  # the proxy's localhost
    ],
)
def test_an_upstream_elsewhere_is_not_taken_for_prefixpin(
    listen: dict[str, object], upstream: dict[str, object]
) -> None:
    from_mapping({"listen": listen, "upstream": upstream})


def test_an_upstream_an_egress_proxy_reaches_is_not_judged() -> None:
    env = Environment(http_proxy="http://proxy.internal:3128")
    assert from_mapping({"upstream": {"url": "http://localhost:8787"}}, env).upstream.url == "http://localhost:8787"
    with pytest.raises(ConfigError, match=SELF):  # https goes direct: no proxy named for it
        from_mapping({"upstream": {"url": "https://localhost:8787"}}, env)


def test_serve_refuses_an_upstream_that_is_itself(tmp_path: Path) -> None:
    direct = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    out = subprocess.run(
        [*prefixpin_argv(), "serve", "--upstream", "http://localhost:8911/v1", "--port", "8911"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=direct,
        timeout=60,
    )
    assert out.returncode == 2 and f"upstream.url: {SELF} (listen 127.0.0.1:8911)" in out.stderr


def test_provider_cache_keys_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("provider_cache: {anthropic_ttl: 1h, openai_retention: off, diagnostics: off}\n")
    pc = load(path, env={}).provider_cache  # YAML's bare off (false) is the word
    assert (pc.anthropic_ttl, pc.openai_retention, pc.diagnostics) == ("1h", "off", "off")
    path.write_text("provider_cache: {anthropic_ttl: auto, openai_retention: 24h, diagnostics: auto}\n")
    pc = load(path, env={}).provider_cache
    assert (pc.anthropic_ttl, pc.openai_retention, pc.diagnostics) == ("auto", "24h", "auto")
    assert Config().provider_cache.anthropic_ttl == "5m"
    path.write_text("provider_cache: {openai_breakpoints: off, min_tokens: {my-model: 2048, gpt-5.6: 0}}\n")
    pc = load(path, env={}).provider_cache
    assert pc.openai_breakpoints == "off" and pc.min_token_map() == {"my-model": 2048, "gpt-5.6": 0}
    path.write_text("provider_cache: {openai_breakpoints: auto}\n")
    config = load(path, env={})
    assert config.provider_cache.openai_breakpoints == "auto"
    assert config.public_dict()["provider_cache"]["min_tokens"] == {}


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


def check_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXPIN_")}
    return subprocess.run(
        [*prefixpin_argv(), "check-config", *args],
        capture_output=True,
        text=True,
        env={**environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def test_every_problem_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(
            {
                "listen": {"port": "x", "hots": 1},
                "store": {"backend": "mongo"},
                "canonicalize": {
                    "packs": ["nope"],
                    "rules": [{"name": "a"}, {"name": "b", "pattern": "(", "action": "pin"}],
                },
                "fork": {"markers": ["["], "min_depth": 0},
                "foo": 1,
                "upstream": {"url": "ftp://x", "tls": {"verify": "maybe"}},
                "provider_cache": {"prices": {"m": {"input": -1}}},
            }
        )
    found = info.value.problems
    for key in (
        "listen.port: must be an integer",
        "listen.hots: unknown key",
        "store.backend: must be one of memory, redis",
        "canonicalize.packs: unknown pack(s) nope",
        "canonicalize.rules[0].pattern: is required",
        "canonicalize.rules[0].action: is required",
        "canonicalize.rules[1] (b): pattern does not compile",
        "fork.markers[0]: does not compile",
        "fork.min_depth: must be at least 1",
        "foo: unknown key",
        "upstream.url: must be an http(s) URL",
        "upstream.tls.verify: must be true or false",
        "provider_cache.prices.m.input: is required",
        "provider_cache.prices.m.output: is required",
    ):
        assert sum(p.startswith(key) for p in found) == 1, (key, found)
    assert str(info.value) == "\n".join(found)


def test_check_config_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: x}\nstore: {backend: mongo}\ncanonicalize: {packs: [nope]}\n")
    out = check_config(str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert f"invalid configuration ({bad}), 3 problems:" in out.stderr
    for problem in ("listen.port: must be", "store.backend: must be", "canonicalize.packs: unknown pack"):
        assert f"\n  {problem}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"listen: [\n", "line 2, column 1: is not valid YAML"),
        (b"a: b: c\n", "line 1, column 5: is not valid YAML: mapping values are not allowed here"),
        (b"listen:\n\tport: 1\n", "line 2, column 1: is not valid YAML"),
        (b"x: !!python/object:os.system {}\n", "is not valid YAML: could not determine a constructor"),
        (b"\xff\xfe\x00", "is not UTF-8 text"),
        (b"- a\n- b\n", "the top level must be a mapping (got list)"),
    ],
)
def test_check_config_invalid_yaml_exits_2(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    out = check_config(str(path))
    assert out.returncode == 2, out.stderr
    assert f"config file {str(path)!r}" in out.stderr and message in out.stderr
    assert "Traceback" not in out.stderr


def test_check_config_reads_prefixpin_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: {port: 9123}\n")
    out = check_config("--json", env={"PREFIXPIN_CONFIG": str(path)})
    assert out.returncode == 0 and json.loads(out.stdout)["listen"]["port"] == 9123
    path.write_text("listen: {port: 0}\n")
    out = check_config(env={"PREFIXPIN_CONFIG": str(path)})
    assert out.returncode == 2 and f"({path}): listen.port: must be greater than 0" in out.stderr
    out = check_config("--json")  # neither: the defaults, and a word that they are
    assert out.returncode == 0 and json.loads(out.stdout)["listen"]["port"] == 8787
    assert "no config file" in out.stderr


def test_serve_with_a_bad_config_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("store: {backend: mongo}\n")
    out = subprocess.run(
        [*prefixpin_argv(), "serve", "--config", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert out.returncode == 2 and "store.backend: must be one of memory, redis (got 'mongo')" in out.stderr


@pytest.mark.parametrize("command", ["check-config", "audit"])
def test_no_traceback_when_the_reader_is_gone(tmp_path: Path, command: str) -> None:
    """``prefixpin ... | head``: stdout's reader closed before prefixpin wrote (a pipe
    with no reader, as head leaves it), and through a real ``head -1``."""
    argv = [*prefixpin_argv(), command]
    if command == "audit":
        trace = tmp_path / "t.jsonl"
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 200}]}
        trace.write_text("".join(json.dumps({"t": i, "body": body}) + "\n" for i in range(300)))
        argv += [str(trace), "--json", "--no-progress"]
    else:
        argv += [str(REPO / "config.example.yaml")]
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    finally:
        os.close(write)
    assert out.returncode == 141 and out.stderr == ""
    piped = subprocess.run(
        f"{shlex.join(argv)} | head -1", shell=True, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert piped.returncode == 0 and piped.stdout.strip() and piped.stderr == ""


def test_trace_defaults_and_the_serve_flag(tmp_path: Path) -> None:
    c = load(None, env={})
    assert (c.trace.path, c.trace.max_bytes, c.trace.keep) == (None, 256 * 2**20, 3)
    flagged = load(None, env={}, overrides={"trace.path": str(tmp_path / "t.jsonl")})  # serve --trace PATH
    assert flagged.trace.path == str(tmp_path / "t.jsonl")
    parser_args = build_parser().parse_args(["serve", "--trace", "x.jsonl"])
    assert parser_args.trace == "x.jsonl"


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
    out = check_config(str(bad))
    assert out.returncode == 2 and "store.redis_url: names one host" in out.stderr
