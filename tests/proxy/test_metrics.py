"""proxy.metrics: a family hands out one child per label set, and forgets it with the series."""

from __future__ import annotations

from prometheus_client import generate_latest

from proxy.metrics import Metrics


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
