"""The providers' own prompt caches (``provider_cache``).

Before the upstream: a ``prompt_cache_key`` per lineage where the API has one
(``Exchange.cache_key_member``) and the client set none, and Anthropic
``cache_control`` breakpoints on a ``/v1/messages`` request that carries none
(and, with ``upstream.kind: litellm``, on a chat completion for an
``anthropic/…`` model, which LiteLLM carries over); all are edits spliced into
the client's bytes.

After the response: what the request cost and what its cached tokens saved
(``prefixpin_cost_usd_total`` / ``prefixpin_saved_usd_total``), and, when the
provider explained its cache result, whether prefixpin's own break cause agrees
(``prefixpin_cache_verdicts_total{agree}``).
"""

from __future__ import annotations

import asyncio

import orjson

from canonicalize import CHAT, MESSAGES, Usage, predict
from canonicalize.edits import AddMember
from canonicalize.provider import (
    NO_BREAK,
    breakpoints,
    cache_key,
    chat_breakpoints,
    place,
    provider_cause,
    sent_breakpoints,
)
from proxy.config import Price
from proxy.flow import Flow
from proxy.pricing import Pricing, cost, saved
from proxy.services import Services


class ProviderCache:
    name = "provider_cache"
    counts_only = True  # its done hook only counts: it may run later (proxy.addons.Runner.done)

    def __init__(self, s: Services, *, pricing: Pricing | None = None) -> None:
        self.s = s
        self.settings = s.config.provider_cache
        self.pricing = pricing or Pricing(self.settings.price_map())
        # LiteLLM turns chat completions for "anthropic/…" models into Messages requests.
        self.via_litellm = s.config.upstream.kind == "litellm"

    async def request(self, flow: Flow) -> None:
        if not flow.editable or flow.body is None or flow.doc is None:
            return
        member = flow.exchange.cache_key_member
        if (
            self.settings.prompt_cache_key == "lineage"
            and member is not None
            and member not in flow.body
            and flow.outcome is not None
        ):
            key = cache_key(flow.tenant, flow.outcome.record.root_id)
            flow.ops.append(AddMember(member, orjson.dumps(key)))
        if self.settings.anthropic_breakpoints == "auto" and not sent_breakpoints(flow.raw):
            if flow.exchange is MESSAGES:
                flow.ops = place(flow.ops, breakpoints(flow.doc, flow.body))
            elif self.via_litellm and flow.exchange is CHAT and str(flow.model).startswith("anthropic/"):
                flow.ops = place(flow.ops, chat_breakpoints(flow.body))

    def done(self, flow: Flow) -> None:
        reply = flow.reply
        if reply is None or not 200 <= flow.status < 300:
            return
        usage = reply.usage.result
        if usage is not None:
            self._dollars(flow, usage, reply.usage.completion)
        if reply.usage.diagnostics is not None:
            self._verdict(flow, reply.usage.diagnostics)

    def _dollars(self, flow: Flow, usage: Usage, completion: int) -> None:
        model = flow.model
        if not isinstance(model, str):
            return
        label = self.s.metrics.model_label(model, answered=True)
        if self.pricing.known(model):
            self._count(label, self.pricing.price(model), usage, completion)
            return

        async def later() -> None:  # the first lookup may import LiteLLM: off the event loop
            price = await asyncio.to_thread(self.pricing.price, model)
            self._count(label, price, usage, completion)

        self.s.spawn(later())

    def _count(self, label: str, price: Price | None, usage: Usage, completion: int) -> None:
        if price is not None:
            self.s.metrics.cost_usd.labels(label).inc(cost(price, usage, completion))
            self.s.metrics.saved_usd.labels(label).inc(saved(price, usage.cached))

    def _verdict(self, flow: Flow, diagnostics: object) -> None:
        theirs = provider_cause(diagnostics)
        outcome, prep = flow.outcome, flow.prep
        if theirs is None or outcome is None or prep is None:
            return
        if outcome.parent_fp is None or outcome.record.fingerprint is None:
            return  # a root: prefixpin has nothing it compared with
        ours = predict(outcome.record.fingerprint, outcome.parent_fp, outcome.depth, prep.sizes).cause
        agree = (ours or NO_BREAK) == theirs
        self.s.metrics.cache_verdicts.labels("yes" if agree else "no").inc()
