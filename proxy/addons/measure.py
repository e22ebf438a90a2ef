"""After the response: usage by model and role, rewrites, forks, blocked tool
calls, the predicted prefix against the parent (with the cause of a break), and
the uncached tokens by cause.

``prefixpin_uncached_tokens_total{cause}``: each answered request's ``prompt -
cached`` tokens, split by :func:`canonicalize.split_uncached` from the byte
prediction against its parent (:func:`canonicalize.parent_of`): ``new`` (what the
parent never sent; all of a request without a parent, bypassed and failed-open
ones included), the break's cause, and ``evicted`` (bytes the parent had sent that
the upstream no longer served).  The parts sum to ``prompt - cached`` exactly,
request by request, so the family sums to prompt minus cached tokens.  Only
counts leave this hook: no prompt text reaches a label or a log line.
"""

from __future__ import annotations

import time

from canonicalize import Canonicalized, Prediction, split_uncached
from proxy.flow import Flow, Parsed
from proxy.metrics import Metrics


class Measure:
    name = "measure"
    needs = (Parsed, Canonicalized)
    when = "counted"  # off the request's path (proxy.addons.counting)

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def done(self, flow: Flow) -> None:
        m, answer, route = self.m, flow.answer, flow.inbound.exchange.name
        role = flow.role
        m.requests.labels(route, role, str(answer.status)).inc()
        m.request_duration.labels(route).observe((answer.ended or time.perf_counter()) - flow.inbound.started)
        p = prediction(flow)
        reply = answer.reply
        usage = reply.usage.result if reply is not None else None
        if usage is not None:
            model = m.model_label(flow.model, answered=200 <= answer.status < 300)  # a junk name gets no slot
            m.prompt_tokens.labels(model, role).inc(usage.prompt)
            # Each series exists once its labels are used; a zero is not added (an inc takes a lock).
            cached, written = m.cached_tokens.labels(model, role), m.cache_write_tokens.labels(model, role)
            if usage.cached:
                cached.inc(usage.cached)
            if usage.cache_write:
                written.inc(usage.cache_write)
            for cause, tokens in split_uncached(p, usage.prompt, usage.cached).items():
                m.uncached_tokens.labels(cause).inc(tokens)
        if reply is not None and reply.blocked:
            m.blocked_tool_calls.inc(reply.blocked)
        for rule in flow.rewrites:
            m.rewrites.labels(rule).inc()
        outcome = flow.outcome
        if outcome is not None and outcome.fork_action:
            m.forks.labels(outcome.fork_action).inc()
        if p is not None:
            m.predicted_prefix_ratio.observe(p.ratio)
            if p.cause is not None:
                m.prefix_breaks.labels(p.cause).inc()


def prediction(flow: Flow) -> Prediction | None:
    """The forwarded request against its parent (the core's, :class:`Canonicalized`);
    None: it has none (or is not ours)."""
    done = flow.done
    return done.prediction if done is not None else None
