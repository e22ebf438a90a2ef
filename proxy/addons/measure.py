"""After the response: usage by model and role, rewrites, forks, blocked tool
calls, and the predicted prefix against the parent (with the cause of a break)."""

from __future__ import annotations

import time

from canonicalize import predict
from proxy.flow import Flow
from proxy.metrics import Metrics


class Measure:
    name = "measure"
    counts_only = True  # its done hook may run later (proxy.addons.Runner.done)

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def done(self, flow: Flow) -> None:
        m = self.m
        m.requests.labels(flow.exchange.name, flow.role, str(flow.status)).inc()
        m.request_duration.labels(flow.exchange.name).observe((flow.ended or time.perf_counter()) - flow.started)
        reply = flow.reply
        usage = reply.usage.result if reply is not None else None
        if usage is not None:
            model = m.model_label(flow.model, answered=200 <= flow.status < 300)  # a junk name gets no slot
            m.prompt_tokens.labels(model, flow.role).inc(usage.prompt)
            m.cached_tokens.labels(model, flow.role).inc(usage.cached)
            m.cache_write_tokens.labels(model, flow.role).inc(usage.cache_write)
        if reply is not None and reply.blocked:
            m.blocked_tool_calls.inc(reply.blocked)
        for rule in flow.rewrites:
            m.rewrites.labels(rule).inc()
        outcome, prep = flow.outcome, flow.prep
        if outcome is None or prep is None:
            return
        if outcome.fork_action:
            m.forks.labels(outcome.fork_action).inc()
        if outcome.parent_fp is not None and outcome.record.fingerprint is not None:
            p = predict(outcome.record.fingerprint, outcome.parent_fp, outcome.depth, prep.sizes)
            m.predicted_prefix_ratio.observe(p.ratio)
            if p.cause is not None:
                m.prefix_breaks.labels(p.cause).inc()
