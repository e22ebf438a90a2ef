"""proxy.metrics: a family hands out one child per label set, and forgets it with the series."""

from __future__ import annotations

import importlib
import re

from prometheus_client import generate_latest

from proxy.metrics import FAIL_OPEN_STAGES, UPSTREAM_ERROR_KINDS, Metrics
from tests.infra.procs import REPO


def test_labels_hands_out_one_child_per_label_set() -> None:
    m = Metrics()
    child = m.requests.labels("chat_completions", "bypass", "200")
    assert m.requests.labels("chat_completions", "bypass", "200") is child
    assert m.requests.labels(route="chat_completions", role="bypass", status="200") is child
    child.inc()
    m.request_duration.labels("chat_completions").observe(0.1)
    text = generate_latest(m.registry).decode()
    assert 'prefixpin_requests_total{role="bypass",route="chat_completions",status="200"} 1.0' in text
    assert 'prefixpin_request_duration_seconds_count{route="chat_completions"} 1.0' in text


def test_a_removed_series_starts_again_from_zero() -> None:
    m = Metrics()
    m.upstream_errors.labels("connect").inc()
    m.upstream_errors.remove("connect")
    m.upstream_errors.labels("connect").inc()
    assert 'prefixpin_upstream_errors_total{kind="connect"} 1.0' in generate_latest(m.registry).decode()
    m.upstream_errors.clear()
    m.upstream_errors.labels("connect").inc()
    assert 'prefixpin_upstream_errors_total{kind="connect"} 1.0' in generate_latest(m.registry).decode()


def test_no_created_series() -> None:
    """One ``*_created`` sample per counter and histogram child doubled /metrics; nothing reads them."""
    m = Metrics()
    m.requests.labels("chat_completions", "root", "200").inc()
    m.request_duration.labels("chat_completions").observe(0.1)
    text = generate_latest(m.registry).decode()
    assert "prefixpin_requests_total" in text
    assert "_created" not in text


def test_every_stage_and_kind_the_code_can_count_starts_at_zero_and_is_documented() -> None:
    """A series Prometheus first sees already at 1 hides that first event from rate() and
    from an alert on it, so each value the code can give ``stage`` and ``kind`` exists at
    0 from the start, and docs/metrics.md names it.  The values are read from the code:
    the literal ones counted, the addons' names (a hook that fails counts its name), the
    upstream errors' ``metric_kind`` and the error statuses an upstream answers with."""
    from proxy.errors import PrefixpinError

    code = "\n".join(p.read_text() for p in sorted((REPO / "proxy").rglob("*.py")))
    stages = set(re.findall(r'fail_open\.labels\("(\w+)"\)', code))
    stages |= set(re.findall(r'runner\.failed\(flow, "(\w+)"\)', code))
    for path in (REPO / "proxy/addons").glob("*.py"):
        module = importlib.import_module(f"proxy.addons.{path.stem}")
        stages |= {
            obj.name
            for obj in vars(module).values()
            if isinstance(obj, type) and obj.__module__ == module.__name__ and isinstance(vars(obj).get("name"), str)
        }
    kinds = set(re.findall(r'upstream_errors\.labels\("(\w+)"\)', code)) | {"http_4xx", "http_5xx"}
    assert 'labels(f"http_{' in code  # (the statuses counted: 400 and up, as the upstream answered)
    errors = importlib.import_module("proxy.errors")
    kinds |= {c.metric_kind for c in vars(errors).values() if isinstance(c, type) and issubclass(c, PrefixpinError)}
    assert {"decode", "trace", "canonicalize", "response", "record"} <= stages and {"encoding", "other"} <= kinds
    assert stages <= set(FAIL_OPEN_STAGES), stages - set(FAIL_OPEN_STAGES)
    assert kinds <= set(UPSTREAM_ERROR_KINDS), kinds - set(UPSTREAM_ERROR_KINDS)
    text = generate_latest(Metrics().registry).decode()
    for stage in FAIL_OPEN_STAGES:
        assert f'prefixpin_fail_open_total{{stage="{stage}"}} 0.0' in text
    for kind in UPSTREAM_ERROR_KINDS:
        assert f'prefixpin_upstream_errors_total{{kind="{kind}"}} 0.0' in text
    doc = (REPO / "docs/metrics.md").read_text().splitlines()
    rows = {ln.split("|")[1].strip(" `"): ln for ln in doc if ln.startswith("| `")}
    for name, values in (
        ("prefixpin_fail_open_total", FAIL_OPEN_STAGES),
        ("prefixpin_upstream_errors_total", UPSTREAM_ERROR_KINDS),
    ):
        missing = [v for v in values if f"`{v}`" not in rows[name]]
        assert not missing, f"docs/metrics.md's {name} row does not name {missing}"
