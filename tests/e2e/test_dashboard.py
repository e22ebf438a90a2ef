"""The Grafana dashboard against real data: every panel query answers.

A real Prometheus (config: ``deploy/prometheus/prometheus.yml`` with the test's
targets and a 1 s scrape interval) scrapes a real ``prefixpin serve`` in front of
a real llama-server, and the llama-server itself, while the openai SDK drives a
short hermes-style session through the proxy: turns whose memory counter and
minute change, one streamed turn, a background-review fork with fewer tools, and
one request the upstream rejects.  Then every PromQL expression in
``deploy/grafana/prefixpin.json``, with Grafana's variables substituted, is
evaluated through Prometheus' HTTP API and must return data.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests import hermes
from tests.conftest import track
from tests.infra.procs import REPO
from tests.infra.prometheus import (
    DEPLOY_CONFIG,
    Prometheus,
    prometheus_path,
    scrape_config,
    start_prometheus,
)

DASHBOARD = REPO / "deploy" / "grafana" / "prefixpin.json"
PROMETHEUS = prometheus_path()

# SPEC section 6, exactly.
SPEC_METRICS = {
    "prefixpin_requests_total": {"route", "role", "status"},
    "prefixpin_prompt_tokens_total": {"model", "role"},
    "prefixpin_cached_tokens_total": {"model", "role"},
    "prefixpin_cache_write_tokens_total": {"model", "role"},
    "prefixpin_rewrites_total": {"rule"},
    "prefixpin_forks_total": {"action"},
    "prefixpin_blocked_tool_calls_total": set(),
    "prefixpin_prefix_breaks_total": {"cause"},
    "prefixpin_uncached_tokens_total": {"cause"},
    "prefixpin_fail_open_total": {"stage"},
    "prefixpin_upstream_errors_total": {"kind"},
    "prefixpin_request_duration_seconds": {"route"},
    "prefixpin_overhead_seconds": set(),
    "prefixpin_upstream_ttft_seconds": set(),
    "prefixpin_predicted_prefix_ratio": set(),
    "prefixpin_cost_usd_total": {"model"},
    "prefixpin_saved_usd_total": {"model"},
}
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")
CHAT = 'route="chat_completions"'

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is not installed (apt-get install prometheus)"
)


# -- the dashboard --------------------------------------------------------------------
def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows nest their panels


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def _substitute(expr: str, window: str) -> str:
    """What Grafana sends for ``$model`` = All and a time range covering the test's traffic."""
    for name in ("__rate_interval", "__interval", "__range"):
        expr = expr.replace(f"${{{name}}}", window).replace(f"${name}", window)
    expr = re.sub(r"\$\{model(?::\w+)?\}|\$model\b", ".*", expr)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def test_dashboard_is_importable_and_uses_spec_names() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] == "prefixpin" and dash["id"] is None  # id None: import creates a new one
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    model = variables["model"]
    assert model["definition"] == "label_values(prefixpin_prompt_tokens_total, model)"
    assert model["includeAll"] and model["allValue"] == ".*"

    ids = [p["id"] for p in _panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    used: set[str] = set()
    for panel in _panels(dash["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            expr = target["expr"]
            assert 'model="$model"' not in expr, "multi-value $model needs =~"
            if "rate(" in expr:
                assert "[$__rate_interval]" in expr or "[$__range]" in expr, expr
            for name in re.findall(r"\bprefixpin_\w+", expr):
                used.add(HISTOGRAM_SERIES.sub("", name) if not name.endswith("_total") else name)
    assert used == set(SPEC_METRICS), f"not SPEC names: {used - set(SPEC_METRICS)}; unused: {set(SPEC_METRICS) - used}"


@needs_prometheus
def test_shipped_prometheus_config_is_valid() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (it ships with the prometheus package)")
    out = subprocess.run([promtool, "check", "config", str(DEPLOY_CONFIG)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    jobs = {job["job_name"]: job for job in yaml.safe_load(DEPLOY_CONFIG.read_text())["scrape_configs"]}
    assert jobs["prefixpin"]["static_configs"] == [{"targets": ["127.0.0.1:8787"]}]
    assert jobs["llama-server"]["static_configs"] == [{"targets": ["127.0.0.1:8080"]}]
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())


# -- the traffic ----------------------------------------------------------------------
class Session:
    """A hermes-style conversation through the proxy; keeps what the client saw."""

    def __init__(self, proxy: str, prom: Prometheus) -> None:
        self.client = track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-dashboard", max_retries=0, timeout=120))
        self.prom = prom
        self.history: list[dict[str, Any]] = []
        self.roles: list[str] = []
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.sent = 0

    def _usage(self, usage: Any) -> None:
        assert usage is not None, "the client must see usage"
        self.prompt_tokens += usage.prompt_tokens
        details = usage.prompt_tokens_details
        self.cached_tokens += int(details.cached_tokens or 0) if details else 0

    def _scraped(self) -> None:
        """Each request lands in its own scrape, so rate() sees every series move."""
        self.sent += 1
        self.prom.wait_until(f"sum(prefixpin_requests_total{{{CHAT}}})", self.sent)

    def _request(self, system: str, user: str, tools: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        messages = [{"role": "system", "content": system}, *self.history, {"role": "user", "content": user}]
        return {"model": "tiny", "messages": messages, "tools": tools, "max_tokens": 6, **extra}

    def turn(
        self, system: str, user: str, tools: list[dict[str, Any]], *, stream: bool = False, keep: bool = True
    ) -> None:
        kwargs = self._request(system, user, tools)
        if stream:
            raw = self.client.chat.completions.with_raw_response.create(
                **kwargs, stream=True, stream_options={"include_usage": True}
            )
            content, usage = "", None
            for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    content += chunk.choices[0].delta.content
                if chunk.usage is not None:
                    usage = chunk.usage
        else:
            raw = self.client.chat.completions.with_raw_response.create(**kwargs)
            reply = raw.parse()
            content, usage = reply.choices[0].message.content or "", reply.usage
        self._usage(usage)
        self.roles.append(raw.headers.get("x-prefixpin-role", ""))
        if keep:
            self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": content}]
        self._scraped()

    def rejected(self, system: str, user: str, tools: list[dict[str, Any]], **extra: Any) -> int:
        with pytest.raises(openai.APIStatusError) as info:
            self.client.chat.completions.create(**self._request(system, user, tools, **extra))
        self._scraped()
        return info.value.status_code


def _system(turn: int, **kw: Any) -> str:
    pct, chars = [(49, "1,085"), (50, "1,102"), (52, "1,141"), (53, "1,160"), (55, "1,204")][turn]
    return hermes.system_prompt(pct=pct, chars=chars, minute=f"02:{30 + turn} PM", filler=8, **kw)


Traffic = tuple[str, Prometheus]  # the proxy's base URL, the Prometheus scraping it


@pytest.fixture
def prometheus(
    tmp_path: Path,
    log_dir: Path,
    llama_server: str,
    serve: Callable[..., str],
    write_config: Callable[[dict[str, Any]], Path],
) -> Iterator[Traffic]:
    """``prefixpin serve`` in front of llama-server, and a Prometheus scraping both every second."""
    assert PROMETHEUS is not None
    # A price for the tiny model, so the dollar panel has series to show.
    price = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}
    proxy = serve(llama_server, write_config({"provider_cache": {"prices": {"tiny": price}}}))
    targets = {"prefixpin": proxy.removeprefix("http://"), "llama-server": llama_server.removeprefix("http://")}
    config = scrape_config(targets, interval="1s")
    proc, prom = start_prometheus(
        PROMETHEUS, config, tmp_path / "prometheus", log_dir, name=f"prometheus-{tmp_path.name}"
    )
    try:
        yield proxy, prom
    finally:
        prom.close()
        proc.stop()


@pytest.fixture
def session(prometheus: Traffic) -> Iterator[Session]:
    s = Session(*prometheus)
    yield s
    s.client.close()


@pytest.mark.e2e
@needs_prometheus
def test_every_dashboard_query_returns_data(session: Session) -> None:
    s, prom = session, session.prom
    # Both targets up before any traffic: counters then have a sample before they move.
    prom.wait_until('sum(up{job=~"prefixpin|llama-server"})', 2)
    started = time.time()
    tools = hermes.tools_full()
    s.turn(_system(0), "What does the repo's test suite cover?", tools)
    s.turn(_system(1), "Run the unit tests and summarise failures.", tools)
    s.turn(_system(2), "Which of those failures are flaky?", tools, stream=True)
    # The background review: the conversation replayed with the memory/skill tools only.
    s.turn(
        _system(3, skills=hermes.SKILLS_REVIEW, session="20260514_143301_9f3c1a"),
        hermes.REVIEW_PROMPT,
        hermes.tools_review(),
        keep=False,
    )
    s.turn(_system(3), "Fix the first flaky test.", tools)
    # llama-server takes one choice only: an upstream 4xx, passed through and counted.
    assert s.rejected(_system(4), "Give me three options.", tools, n=3) == 400
    assert s.roles == ["root", "continuation", "continuation", "fork", "continuation"]

    # Two more scrapes of each job after the last request: a series born on the last
    # request then has two samples, which rate() needs.
    last = time.time()
    prom.wait_scrapes_after(["prefixpin", "llama-server"], last, count=2)
    window = f"{math.ceil(time.time() - started) + 30}s"

    assert prom.scalar("sum(prefixpin_cached_tokens_total)") == s.cached_tokens
    assert prom.scalar("sum(prefixpin_prompt_tokens_total)") == s.prompt_tokens
    # Uncached tokens by cause: together, exactly what the client saw uncached.
    assert prom.scalar("sum(prefixpin_uncached_tokens_total)") == s.prompt_tokens - s.cached_tokens
    assert s.cached_tokens > 0, "continuations must hit llama-server's prefix cache"
    assert prom.scalar('sum(prefixpin_forks_total{action="repaired"})') == 1
    assert prom.scalar('sum(prefixpin_upstream_errors_total{kind="http_4xx"})') == 1
    assert prom.scalar("sum(prefixpin_blocked_tool_calls_total)") == 0  # the tiny model never calls tools
    assert "tiny" in prom.label_values("model", "prefixpin_prompt_tokens_total")  # the $model variable
    for name, labels in SPEC_METRICS.items():  # the label sets are part of the contract too
        series = name + "_count" if not name.endswith("_total") else name
        found = prom.query(f'{series}{{job="prefixpin"}}')["result"]
        assert found, f"{name} was never scraped"
        for sample in found:
            assert set(sample["metric"]) - {"__name__", "job", "instance"} == labels, (name, sample["metric"])

    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard)
    assert len(exprs) >= 20
    empty = []
    for title, expr in exprs:
        query = _substitute(expr, window)
        values = prom.values(query)
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title}: {query} -> {values}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
