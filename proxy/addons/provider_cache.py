"""The providers' own prompt caches (``provider_cache``, SPEC section 2b).

Before the upstream, all as edits spliced into the client's bytes:

- ``prompt_cache_key: lineage``: a ``prompt_cache_key`` per lineage where the API
  has one (``Exchange.cache_key_member``) and the client set none;
- ``openai_retention: 24h``: ``prompt_cache_retention: "24h"`` on a chat or
  Responses request that carries neither it nor ``prompt_cache_options`` (OpenAI
  rejects the two together);
- ``anthropic_breakpoints: auto``: Anthropic ``cache_control`` breakpoints on a
  ``/v1/messages`` request that carries none (and, with ``upstream.kind:
  litellm``, on a chat completion for an ``anthropic/…`` model, which LiteLLM
  carries over), the system+tools one with ``anthropic_ttl`` (``auto``: per
  lineage, from the pauses between its requests, :mod:`canonicalize.ttl`);
- ``openai_breakpoints: auto``: OpenAI ``prompt_cache_breakpoint`` markers at the
  end of the stable part of a chat or Responses request that carries none
  (:mod:`canonicalize.openai_cache`; not on an ``anthropic/…`` chat completion
  through LiteLLM, which would drop them: Anthropic has its own);
- ``diagnostics: auto``: a request of a lineage asks the provider why it missed,
  naming the lineage's previous response: on ``/v1/messages``
  ``diagnostics.previous_message_id`` and the ``anthropic-beta`` header, on
  ``/v1/responses`` ``prompt_cache_options.comparison_response_id``.

After the response: what the request cost and what its cache use saved, writes'
extra cost subtracted (``prefixpin_cost_usd_total`` / ``prefixpin_saved_usd_total``);
when the provider explained its cache result, whether prefixpin's own break
cause agrees (``prefixpin_cache_verdicts_total{agree}``); and whether the
request's stable prefix was shorter than its model's minimum cacheable prompt
(``min_tokens``: ``prefixpin_below_cache_minimum_total{model}``, and one INFO line
per lineage, the first time).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import replace

import orjson

from canonicalize import CHAT, MESSAGES, RESPONSES, Usage, minimums, openai_cache, predict, ttl
from canonicalize.edits import AddMember
from canonicalize.provider import (
    breakpoints,
    cache_key,
    chat_breakpoints,
    diagnostics,
    place,
    sent_breakpoints,
    with_beta,
)
from canonicalize.verdicts import agrees, provider_causes
from proxy.config import Price
from proxy.flow import Flow
from proxy.pricing import Pricing, cost, saved
from proxy.services import Services

log = logging.getLogger("prefixpin")
# OpenAI takes one or the other (a request with both is rejected): a client's own is kept.
RETENTION_MEMBERS = ("prompt_cache_retention", "prompt_cache_options")
# Lineages whose stable prefix was said (at INFO) to be below the minimum: the newest kept.
SAID_BELOW = 4096


class ProviderCache:
    name = "provider_cache"
    counts_only = True  # its done hook only counts: it may run later (proxy.addons.Runner.done)

    def __init__(self, s: Services, *, pricing: Pricing | None = None) -> None:
        self.s = s
        self.settings = st = s.config.provider_cache
        self.pricing = pricing or Pricing(st.price_map())
        # LiteLLM turns chat completions for "anthropic/…" models into Messages requests.
        self.via_litellm = s.config.upstream.kind == "litellm"
        self.retention = None if st.openai_retention == "off" else orjson.dumps(st.openai_retention)
        self.min_tokens = st.min_token_map()
        self._said: OrderedDict[str, None] = OrderedDict()  # lineages told below the minimum (bounded)
        self.said_bound = SAID_BELOW
        if st.anthropic_ttl != "5m" and st.anthropic_breakpoints != "auto":
            log.warning(
                "provider_cache.anthropic_ttl: %s applies to the breakpoints prefixpin adds; "
                "with provider_cache.anthropic_breakpoints: off it changes nothing",
                st.anthropic_ttl,
            )

    async def request(self, flow: Flow) -> None:
        if not flow.editable or flow.body is None or flow.doc is None:
            return
        st, body, exchange = self.settings, flow.body, flow.exchange
        member = exchange.cache_key_member
        if st.prompt_cache_key == "lineage" and member is not None and member not in body and flow.outcome is not None:
            key = cache_key(flow.tenant, flow.outcome.record.root_id)
            flow.ops.append(AddMember(member, orjson.dumps(key)))
        retention = (
            self.retention is not None
            and (exchange is CHAT or exchange is RESPONSES)
            and not any(m in body for m in RETENTION_MEMBERS)
        )
        if retention and self.retention is not None:
            flow.ops.append(AddMember("prompt_cache_retention", self.retention))
        anthropic = exchange is MESSAGES or (
            self.via_litellm and exchange is CHAT and str(flow.model).startswith("anthropic/")
        )
        if st.anthropic_breakpoints == "auto" and anthropic and not sent_breakpoints(flow.raw):
            when = self._ttl(flow)
            if exchange is MESSAGES:
                flow.ops = place(flow.ops, breakpoints(flow.doc, body, ttl=when))
            else:
                flow.ops = place(flow.ops, chat_breakpoints(body, ttl=when))
        if (
            st.openai_breakpoints == "auto"
            and (exchange is RESPONSES or (exchange is CHAT and not anthropic))
            and not sent_breakpoints(flow.raw, openai_cache.MEMBER)
        ):
            marks = (openai_cache.chat_breakpoints if exchange is CHAT else openai_cache.responses_breakpoints)(
                flow.doc, body
            )
            flow.ops = place(flow.ops, marks, member=openai_cache.MEMBER)
        if st.diagnostics == "auto" and flow.outcome is not None:
            if exchange is MESSAGES:
                self._diagnostics(flow)
            elif exchange is RESPONSES:
                self._comparison(flow, retention_added=retention)

    def _ttl(self, flow: Flow) -> str:
        """The system+tools breakpoint's TTL; ``auto``: from the lineage's pauses, which
        this request's time joins in its record."""
        when = self.settings.anthropic_ttl
        outcome = flow.outcome
        if when != "auto":
            return when
        if outcome is None:
            return "5m"
        now, record = self.s.clock(), outcome.record
        kept = ttl.pauses(record.pauses, record.at, now)
        flow.outcome = replace(outcome, record=record.evolve(at=now, pauses=kept))
        return ttl.choose(kept, self._cache_prices(flow.model))

    def _cache_prices(self, model: object) -> ttl.CachePrices:
        """The model's configured (or already looked up) prices; Anthropic's ratios
        when it has none yet (no lookup on the request path)."""
        if isinstance(model, str) and self.pricing.known(model):
            price = self.pricing.price(model)
            if price is not None and price.input > 0:
                return ttl.CachePrices(price.cached_input, price.cache_write, price.cache_write_1h)
        return ttl.ANTHROPIC

    def _diagnostics(self, flow: Flow) -> None:
        """Record this turn's message id; name the previous one when the client asked nothing."""
        assert flow.outcome is not None and flow.body is not None
        flow.keep_message_id = True
        previous = flow.outcome.record.message_id
        if previous is None or "diagnostics" in flow.body:
            return
        flow.ops.append(AddMember("diagnostics", diagnostics(previous)))
        beta = with_beta(flow.headers.getlist("anthropic-beta"))
        flow.set_headers = (*(h for h in flow.set_headers if h[0] != "anthropic-beta"), ("anthropic-beta", beta))

    def _comparison(self, flow: Flow, *, retention_added: bool) -> None:
        """Record this turn's response id; name the previous one in
        ``prompt_cache_options.comparison_response_id`` when the client named none."""
        assert flow.outcome is not None and flow.body is not None
        flow.keep_message_id = True
        previous = flow.outcome.record.message_id
        if previous is None:
            return
        op = openai_cache.comparison(flow.body, previous, retention_added=retention_added)
        if op is not None:
            flow.ops.append(op)

    def done(self, flow: Flow) -> None:
        reply = flow.reply
        if reply is None or not 200 <= flow.status < 300:
            return
        usage = reply.usage.result
        if usage is not None:
            self._dollars(flow, usage, reply.usage.completion)
        if reply.usage.diagnostics is not None:
            self._verdict(flow, reply.usage.diagnostics)
        self._minimum(flow, usage)

    def _minimum(self, flow: Flow, usage: Usage | None) -> None:
        """Count a request whose stable prefix its model's minimum leaves uncacheable;
        say so once per lineage (the newest :data:`SAID_BELOW` lineages remembered)."""
        outcome, prep = flow.outcome, flow.prep
        if outcome is None or prep is None or outcome.record.fingerprint is None:
            return
        least = minimums.minimum(flow.model, self.min_tokens)
        if not least:
            return
        stable, total = minimums.stable_bytes(
            prep.exchange, prep.body, outcome.record.fingerprint, prep.sizes, prep.offset
        )
        tokens = minimums.stable_tokens(
            stable, total, usage.prompt if usage is not None else None, continued=prep.offset > 0
        )
        if tokens >= least:
            return
        self.s.metrics.below_cache_minimum.labels(self.s.metrics.model_label(flow.model, answered=True)).inc()
        lineage = outcome.record.id
        if lineage in self._said:
            self._said.move_to_end(lineage)
            return
        self._said[lineage] = None
        if len(self._said) > self.said_bound:
            self._said.popitem(last=False)
        log.info(
            "lineage %s: its stable prefix (system, tools and the history before the last user message) is "
            "about %d tokens, below the %d tokens %r caches at the least: the provider caches none of it "
            "(prefixpin_below_cache_minimum_total; provider_cache.min_tokens)",
            lineage,
            tokens,
            least,
            flow.model,
        )

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
            self.s.metrics.saved_usd.labels(label).inc(saved(price, usage))

    def _verdict(self, flow: Flow, diagnostics: object) -> None:
        outcome, prep = flow.outcome, flow.prep
        if outcome is None or prep is None or provider_causes(diagnostics) is None:
            return
        if outcome.parent_fp is None or outcome.record.fingerprint is None:
            return  # a root: prefixpin has nothing it compared with
        ours = predict(outcome.record.fingerprint, outcome.parent_fp, outcome.depth, prep.sizes).cause
        agree = agrees(ours, diagnostics)
        if agree is not None:
            self.s.metrics.cache_verdicts.labels("yes" if agree else "no").inc()
