"""tenant_of: every credential, wherever the request carries it, and no credential."""

from __future__ import annotations

import hashlib
from urllib.parse import urlencode

import pytest

from proxy.config import ConfigError, Tenancy, from_mapping
from proxy.store import ISOLATED
from proxy.tenancy import SHARED_ANONYMOUS, tenant_of

POLICY = Tenancy()
PLACES = [("header", h) for h in POLICY.credential_headers] + [("param", p) for p in POLICY.credential_params]


def _tenant(place: tuple[str, str], secret: str, policy: Tenancy = POLICY, **headers: str) -> str:
    kind, name = place
    h = {name: secret} if kind == "header" else {}
    q = {name: secret} if kind == "param" else {}
    return tenant_of(_raw({**h, **headers}), urlencode(q).encode(), policy)


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """As ASGI gives them: lower-case names, the values' bytes."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


@pytest.mark.parametrize("place", PLACES, ids=[f"{k}:{n}" for k, n in PLACES])
def test_every_credential_place_makes_a_tenant(place: tuple[str, str]) -> None:
    a, b = _tenant(place, "sk-AAAA"), _tenant(place, "sk-BBBB")
    assert a != b and a == _tenant(place, "sk-AAAA")
    assert a not in (ISOLATED, SHARED_ANONYMOUS) and "AAAA" not in a


def test_the_place_is_part_of_the_tenant() -> None:
    """Documented: one key sent in two places is two tenants (nothing is shared across them)."""
    tenants = {_tenant(place, "sk-same") for place in PLACES}
    assert len(tenants) == len(PLACES)


def test_all_credentials_together_make_one_tenant() -> None:
    def t(headers: dict[str, str], query: str = "") -> str:
        return tenant_of(_raw(headers), query.encode(), POLICY)

    both = t({"authorization": "Bearer A"}, "key=G")
    assert both not in (t({"authorization": "Bearer A"}), t({}, "key=G"))
    assert both == t({"Authorization": "Bearer A"}, "key=G&other=1")  # header names: any case
    assert t({"api-key": "A"}) != t({"api-key": "A", "x-goog-api-key": "G"})
    assert t({}, "key=ab&api_key=c") != t({}, "key=a&api_key=bc")  # no ambiguous concatenation


def test_no_credential() -> None:
    assert tenant_of([], b"", POLICY) == ISOLATED
    assert tenant_of([(b"authorization", b"")], b"key=", POLICY) == ISOLATED
    shared = Tenancy(anonymous="shared")
    assert tenant_of([], b"", shared) == SHARED_ANONYMOUS


def test_configured_places_only() -> None:
    policy = Tenancy(credential_headers=("X-Team-Token",), credential_params=())
    assert _tenant(("header", "x-team-token"), "one", policy) != _tenant(("header", "x-team-token"), "two", policy)
    assert _tenant(("header", "authorization"), "one", policy) == ISOLATED
    assert _tenant(("param", "key"), "one", policy) == ISOLATED


def test_tenant_header_only_when_trusted() -> None:
    trusted = Tenancy(trust_header=True)
    named = _tenant(("header", "authorization"), "k1", trusted, **{"x-prefixpin-tenant": "acme"})
    assert named == _tenant(("param", "key"), "k2", trusted, **{"x-prefixpin-tenant": "acme"})
    assert _tenant(("header", "authorization"), "k1", **{"x-prefixpin-tenant": "acme"}) == _tenant(
        ("header", "authorization"), "k1"
    )
    assert tenant_of([(b"x-prefixpin-tenant", b"acme")], b"", POLICY) == ISOLATED


@pytest.mark.parametrize(
    ("tenancy", "message"),
    [
        ({"anonymous": "everyone"}, "tenancy.anonymous: must be one of isolated, shared"),
        ({"credential_headers": ["bad header"]}, "tenancy.credential_headers[0]: not a header name"),
        ({"credential_headers": "authorization"}, "tenancy.credential_headers: must be a list of strings"),
        ({"credential_params": [""]}, "tenancy.credential_params[0]: must be a non-empty string"),
    ],
)
def test_tenancy_config_errors_name_the_key(tenancy: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_mapping({"tenancy": tenancy})


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ({"tenant_max_entries": 0}, "store.tenant_max_entries: must be greater than 0"),
        ({"tenant_max_bytes": -1}, "store.tenant_max_bytes: must be greater than 0"),
        ({"max_links_per_request": "many"}, "store.max_links_per_request: must be an integer"),
        ({"tenant_max_entries": 100, "max_links_per_request": 100}, "store.tenant_max_entries: must be more than"),
    ],
)
def test_store_bounds_config_errors_name_the_key(store: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping({"store": store})


def test_credentials_are_hashed_as_the_bytes_sent() -> None:
    """Values that differ only in bytes that are not UTF-8 are different tenants: in the
    query (percent-encoded) and in a header (raw)."""
    assert tenant_of([], b"key=sk-%FF%FE", POLICY) != tenant_of([], b"key=sk-%FE%FF", POLICY)
    assert tenant_of([], b"key=sk-%FF", POLICY) != tenant_of([], b"key=sk-%EF%BF%BD", POLICY)  # not U+FFFD
    assert tenant_of([(b"x-api-key", b"k\xff")], b"", POLICY) != tenant_of([(b"x-api-key", b"k\xfe")], b"", POLICY)
    trusted = Tenancy(trust_header=True)
    a = tenant_of([(b"x-prefixpin-tenant", b"t\xff")], b"", trusted)
    assert a != tenant_of([(b"x-prefixpin-tenant", b"t\xfe")], b"", trusted)
    assert tenant_of([], b"key=a%20b", POLICY) == tenant_of([], b"key=a+b", POLICY)  # the same bytes


def test_repeated_credentials_each_count() -> None:
    one = tenant_of([(b"authorization", b"Bearer A")], b"", POLICY)
    assert tenant_of([(b"authorization", b"Bearer A"), (b"authorization", b"Bearer B")], b"", POLICY) != one
    assert tenant_of([(b"authorization", b"Bearer A"), (b"authorization", b"")], b"", POLICY) == one  # empty: none
    assert tenant_of([], b"key=a&key=b", POLICY) != tenant_of([], b"key=a", POLICY)
    assert tenant_of([], b"key=a&other=1", POLICY) == tenant_of([], b"key=a", POLICY)


def test_a_tenant_id_stays_what_it_was() -> None:
    """Stored lineages are keyed by it: the parts in the configured order of the
    credential names (then as sent), each length-prefixed, hashed with blake2b."""

    def expected(*parts: bytes) -> str:
        h = hashlib.blake2b(digest_size=16, person=b"prefixpin")
        for part in parts:
            h.update(len(part).to_bytes(8, "big") + part)
        return "k" + h.hexdigest()

    sent = [(b"x-api-key", b"K"), (b"accept", b"*/*"), (b"authorization", b"Bearer A"), (b"authorization", b"Bearer B")]
    assert tenant_of(sent, b"key=G", POLICY) == expected(
        b"h:authorization=Bearer A", b"h:authorization=Bearer B", b"h:x-api-key=K", b"q:key=G"
    )
    assert tenant_of(sent[::-1], b"", POLICY) == expected(
        b"h:authorization=Bearer B", b"h:authorization=Bearer A", b"h:x-api-key=K"
    )
    twice = Tenancy(credential_headers=("x-api-key", "Authorization", "X-API-Key"))
    assert tenant_of(sent[:1], b"", twice) == expected(b"h:x-api-key=K", b"h:x-api-key=K")  # a name listed twice
