"""proxy.addons: the tuple is the order, and an order that does not give an addon
what it needs is refused; proxy.flow: failing open drops every decision and edit."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from canonicalize import CHAT, AddMember, JsonDoc
from proxy.addons import OrderError, build, check_order
from proxy.addons.bypass import Bypass
from proxy.addons.fork_guard import ForkGuard
from proxy.addons.stream_usage import StreamUsage
from proxy.addons.tenancy import Tenancy
from proxy.config import load
from proxy.flow import Flow, Guarded, Inbound, Parsed, Skip, Tenant
from proxy.offline import Offline


def test_the_apps_addons_each_come_after_what_they_need() -> None:
    s = Offline(load(None, env={})).s
    names = [a.name for a in build(s)]
    assert names[:3] == ["bypass", "tenancy", "canonicalize"] and names[-1] == "record"


def test_an_addon_before_what_it_needs_is_refused() -> None:
    config = load(None, env={})
    check_order((Bypass(), Tenancy(config.tenancy)))
    with pytest.raises(OrderError, match="addon tenancy needs Skip, which no addon before it provides"):
        check_order((Tenancy(config.tenancy), Bypass()))
    with pytest.raises(OrderError, match="addon stream_usage needs Canonicalized"):
        check_order((Bypass(), Tenancy(config.tenancy), StreamUsage(), ForkGuard()))


def test_failing_open_drops_the_decisions_and_edits_but_the_facts() -> None:
    flow = Flow(Inbound(CHAT, "/v1/chat/completions", b"", Headers(), b'{"model":"m"}', 0.0))
    flow.decide(Tenant("k1"))
    flow.decide(Parsed({"model": "m"}, JsonDoc(b'{"model":"m"}')))
    flow.decide(Guarded(frozenset({"ls"})))
    flow.outbound.ops.append(AddMember("x", b"1"))
    flow.outbound.headers = (("anthropic-beta", "b"),)
    flow.fail_open()
    assert flow.role == "fail-open" and flow.failed
    assert flow.get(Guarded) is None and not flow.outbound.ops and not flow.outbound.headers
    assert flow.tenant == "k1" and flow.model == "m" and flow.get(Skip) is None
    assert flow.out == b'{"model":"m"}'  # what the client sent


@pytest.mark.parametrize(
    ("raw", "bypassed"),
    [
        ([], False),
        ([(b"x-prefixpin-bypass", b"1")], True),
        ([(b"x-prefixpin-bypass", b" 1\t")], True),
        ([(b"x-prefixpin-bypass", b"\xa01")], True),  # as Headers.get's value, stripped
        ([(b"x-prefixpin-bypass", b"0")], False),
        ([(b"x-prefixpin-bypass", b"true")], False),
        ([(b"x-prefixpin-bypass", b"0"), (b"x-prefixpin-bypass", b"1")], False),  # the first value
        ([(b"x-prefixpin-bypass", b"1"), (b"x-prefixpin-bypass", b"0")], True),
        ([(b"x-other", b"1")], False),
    ],
)
def test_bypassed_reads_the_first_value_as_headers_get_does(raw: list[tuple[bytes, bytes]], bypassed: bool) -> None:
    headers = Headers(raw=raw)
    inbound = Inbound(CHAT, "/v1/chat/completions", b"", headers, b"{}", 0.0)
    assert inbound.bypassed is bypassed
    assert (headers.get("x-prefixpin-bypass", "").strip() == "1") is bypassed
