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

import orjson

from canonicalize import (
    CHAT,
    MESSAGES,
    RESPONSES,
    Canonicalized,
    LineageRecord,
    Usage,
    minimums,
    openai_cache,
    predict,
    ttl,
)
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
from proxy.flow import CacheControls, Edits, Flow, Parsed, Tenant
from proxy.pricing import Pricing, cost, saved
from proxy.services import Services

log = logging.getLogger("prefixpin")
# OpenAI takes one or the other (a request with both is rejected): a client's own is kept.
RETENTION_MEMBERS = ("prompt_cache_retention", "prompt_cache_options")
# Lineages whose stable prefix was said (at INFO) to be below the minimum: the newest kept.
SAID_BELOW = 4096
MINIMUMS_KEPT = 256  # models whose minimum is remembered (past it: forgotten, looked up again)
UNPRICED_KEPT = 4096  # requests whose cost waits for the cost map's first load (past it: not counted)


class ProviderCache:
    name = "provider_cache"
    needs = (Tenant, Parsed, Canonicalized, Edits)
    provides = (CacheControls, Edits)
    when = "counted"  # its done hook only counts: off the request's path (proxy.addons.counting)

    def __init__(self, s: Services, *, pricing: Pricing | None = None) -> None:
        self.s = s
        self.settings = st = s.config.provider_cache
        self.pricing = pricing or Pricing(st.price_map())
        # LiteLLM turns chat completions for "anthropic/…" models into Messages requests.
        self.via_litellm = s.config.upstream.kind == "litellm"
        self.retention = None if st.openai_retention == "off" else orjson.dumps(st.openai_retention)
        self.min_tokens = st.min_token_map()
        self._minimums: dict[object, int | None] = {}  # per model name (bounded: MINIMUMS_KEPT)
        self._said: OrderedDict[str, None] = OrderedDict()  # lineages told below the minimum (bounded)
        # Costs waiting for the cost map's first load (one load, off the event loop).
        self._unpriced: list[tuple[str, str, Usage, int]] = []
        self._loading = False
        self.said_bound = SAID_BELOW
        if st.anthropic_ttl != "5m" and st.anthropic_breakpoints != "auto":
            log.warning(
                "provider_cache.anthropic_ttl: %s applies to the breakpoints prefixpin adds; "
                "with provider_cache.anthropic_breakpoints: off it changes nothing",
                st.anthropic_ttl,
            )

    def request(self, flow: Flow) -> None:
        done = flow.done
        if done is None or flow.failed:
            return
        st, body, exchange, out = self.settings, done.body, flow.inbound.exchange, flow.outbound
        member = exchange.cache_key_member
        if st.prompt_cache_key == "lineage" and member is not None and member not in body and done.outcome is not None:
            key = cache_key(flow.tenant, done.outcome.record.root_id)
            out.ops.append(AddMember(member, orjson.dumps(key)))
        retention = (
            self.retention is not None
            and (exchange is CHAT or exchange is RESPONSES)
            and not any(m in body for m in RETENTION_MEMBERS)
        )
        if retention and self.retention is not None:
            out.ops.append(AddMember("prompt_cache_retention", self.retention))
        record = self._breakpoints(flow, done)
        keep = False
        if st.diagnostics == "auto" and done.outcome is not None:
            if exchange is MESSAGES:
                keep = self._diagnostics(flow, done)
            elif exchange is RESPONSES:
                keep = self._comparison(flow, done, retention_added=retention)
        if keep or record is not None:
            flow.decide(CacheControls(keep, record))

    def _breakpoints(self, flow: Flow, done: Canonicalized) -> LineageRecord | None:
        """Anthropic's or OpenAI's breakpoints, fitted into the edits made so far; the
        record with this request's time among its pauses (``anthropic_ttl: auto``)."""
        st, body, exchange, out, raw = self.settings, done.body, flow.inbound.exchange, flow.outbound, flow.inbound.raw
        anthropic = exchange is MESSAGES or (
            self.via_litellm and exchange is CHAT and str(flow.model).startswith("anthropic/")
        )
        record = None
        if st.anthropic_breakpoints == "auto" and anthropic and not sent_breakpoints(raw):
            when, record = self._ttl(done)
            if exchange is MESSAGES:
                out.ops = place(out.ops, breakpoints(done.doc, body, ttl=when))
            else:
                out.ops = place(out.ops, chat_breakpoints(body, ttl=when))
        if (
            st.openai_breakpoints == "auto"
            and (exchange is RESPONSES or (exchange is CHAT and not anthropic))
            and not sent_breakpoints(raw, openai_cache.MEMBER)
        ):
            marks = (openai_cache.chat_breakpoints if exchange is CHAT else openai_cache.responses_breakpoints)(
                done.doc, body
            )
            out.ops = place(out.ops, marks, member=openai_cache.MEMBER)
        return record

    def _ttl(self, done: Canonicalized) -> tuple[str, LineageRecord | None]:
        """The system+tools breakpoint's TTL; ``auto``: from the lineage's pauses, which
        this request's time joins in its record (returned, to be recorded)."""
        when = self.settings.anthropic_ttl
        outcome = done.outcome
        if when != "auto":
            return when, None
        if outcome is None:
            return "5m", None
        now, record = self.s.clock(), outcome.record
        kept = ttl.pauses(record.pauses, record.at, now)
        return ttl.choose(kept, self._cache_prices(done.body.get("model"))), record.evolve(at=now, pauses=kept)

    def _cache_prices(self, model: object) -> ttl.CachePrices:
        """The model's configured (or already looked up) prices; Anthropic's ratios
        when it has none yet (no lookup on the request path)."""
        if isinstance(model, str) and self.pricing.known(model):
            price = self.pricing.price(model)
            if price is not None and price.input > 0:
                return ttl.CachePrices(price.cached_input, price.cache_write, price.cache_write_1h)
        return ttl.ANTHROPIC

    def _diagnostics(self, flow: Flow, done: Canonicalized) -> bool:
        """Record this turn's message id; name the previous one when the client asked nothing."""
        assert done.outcome is not None
        previous = done.outcome.record.message_id
        if previous is None or "diagnostics" in done.body:
            return True
        out = flow.outbound
        out.ops.append(AddMember("diagnostics", diagnostics(previous)))
        beta = with_beta(flow.inbound.headers.getlist("anthropic-beta"))
        out.headers = (*(h for h in out.headers if h[0] != "anthropic-beta"), ("anthropic-beta", beta))
        return True

    def _comparison(self, flow: Flow, done: Canonicalized, *, retention_added: bool) -> bool:
        """Record this turn's response id; name the previous one in
        ``prompt_cache_options.comparison_response_id`` when the client named none."""
        assert done.outcome is not None
        previous = done.outcome.record.message_id
        if previous is None:
            return True
        op = openai_cache.comparison(done.body, previous, retention_added=retention_added)
        if op is not None:
            flow.outbound.ops.append(op)
        return True

    def done(self, flow: Flow) -> None:
        reply = flow.answer.reply
        if reply is None or not 200 <= flow.answer.status < 300:
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
        done = flow.done
        outcome = done.outcome if done is not None else None
        if done is None or outcome is None or outcome.record.fingerprint is None:
            return
        prep = done.prep
        least = self._least(flow.model)
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

    def _least(self, model: object) -> int | None:
        """:func:`canonicalize.minimums.minimum` of ``model``, remembered per model name."""
        try:
            return self._minimums[model]
        except (KeyError, TypeError):  # (TypeError: a model that is not a name, not hashable)
            least = minimums.minimum(model, self.min_tokens)
        if isinstance(model, str):
            if len(self._minimums) >= MINIMUMS_KEPT:
                self._minimums.clear()
            self._minimums[model] = least
        return least

    def _dollars(self, flow: Flow, usage: Usage, completion: int) -> None:
        model = flow.model
        if not isinstance(model, str):
            return
        label = self.s.metrics.model_label(model, answered=True)
        if self.pricing.known(model):
            self._count(label, self.pricing.price(model), usage, completion)
            return
        if len(self._unpriced) >= UNPRICED_KEPT:
            self.s.metrics.fail_open.labels(self.name).inc()  # (the load takes seconds, not this many requests)
            return
        self._unpriced.append((model, label, usage, completion))
        if not self._loading:
            self._loading = True
            self.s.spawn(self._load())

    async def _load(self) -> None:
        """The cost map loaded on a worker thread (it may import LiteLLM); then the costs
        that waited for it counted."""
        try:
            await asyncio.to_thread(self.pricing.load)
        except Exception:
            log.exception("LiteLLM's cost map could not be loaded: the costs waiting for it are not counted")
        self._loading = False
        waiting, self._unpriced = self._unpriced, []
        if not self.pricing.loaded:
            self.s.metrics.fail_open.labels(self.name).inc(len(waiting))
            return
        for model, label, usage, completion in waiting:
            self._count(label, self.pricing.price(model), usage, completion)

    def _count(self, label: str, price: Price | None, usage: Usage, completion: int) -> None:
        if price is not None:
            self.s.metrics.cost_usd.labels(label).inc(cost(price, usage, completion))
            self.s.metrics.saved_usd.labels(label).inc(saved(price, usage))

    def _verdict(self, flow: Flow, diagnostics: object) -> None:
        done = flow.done
        outcome = done.outcome if done is not None else None
        if done is None or outcome is None or provider_causes(diagnostics) is None:
            return
        prep = done.prep
        if outcome.parent_fp is None or outcome.record.fingerprint is None:
            return  # a root: prefixpin has nothing it compared with
        ours = predict(outcome.record.fingerprint, outcome.parent_fp, outcome.depth, prep.sizes).cause
        agree = agrees(ours, diagnostics)
        if agree is not None:
            self.s.metrics.cache_verdicts.labels("yes" if agree else "no").inc()
