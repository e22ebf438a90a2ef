"""Issue #16 against the real ``prefixpin serve``: tenants from every credential,
per-tenant store bounds, bounded model labels.

What another tenant's request receives is checked on the bytes the recording
upstream got.  No test waits between turns: the memory store has a turn before
prefixpin reads the next request (proxy.handler); only a body of 1 MiB or more is
recorded in a task, after its response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests import hermes
from tests.conftest import Recorder, track
from tests.infra.procs import prefixpin_logs, start_prefixpin
from tests.infra.wait import wait_until

pytestmark = pytest.mark.e2e

MARKER = "REVIEW-NOW-7f3a"
USER1 = {"role": "user", "content": "List the files in the repo, please."}
PLACES = [
    *(("header", h) for h in ("authorization", "x-api-key", "api-key", "x-goog-api-key")),
    *(("param", p) for p in ("key", "api_key", "api-key", "access_token")),
    ("none", ""),
]


@pytest.fixture(scope="module")
def marker_proxy(log_dir: Path, recorder_proc: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Default tenancy, plus a fork marker (the third way to declare a fork)."""
    config = tmp_path_factory.mktemp("isolation") / "config.yaml"
    config.write_text(yaml.safe_dump({"fork": {"markers": [MARKER]}}))
    proc, base = start_prefixpin(log_dir, upstream=recorder_proc, config=config, name="prefixpin-isolation")
    yield base
    proc.stop()


def _post(
    proxy: str, place: tuple[str, str], secret: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    kind, name = place
    http = track(httpx.Client(trust_env=False, timeout=60))
    h = dict(headers or {})
    params = {}
    if kind == "header":
        h[name] = f"Bearer {secret}" if name == "authorization" else secret
    elif kind == "param":
        params[name] = secret
    r = http.post(proxy + "/v1/chat/completions", json=body, headers=h, params=params)
    assert r.status_code == 200, r.text
    return r


def _reply(r: httpx.Response) -> dict[str, Any]:
    msg = r.json()["choices"][0]["message"]
    return {"role": "assistant", "content": msg["content"]}


def _victim_tools(secret: str) -> list[dict[str, Any]]:
    tools = hermes.tools_full()
    tools[0]["function"]["description"] += f" {secret}"
    return tools


@pytest.mark.parametrize("place", PLACES, ids=[f"{k}:{n}" if n else k for k, n in PLACES])
def test_another_tenant_never_gets_a_victims_system_or_tools(
    marker_proxy: str, recorder: Recorder, place: tuple[str, str]
) -> None:
    """Tenant B replays tenant A's conversation with each fork signal (a marker, a
    tools[] subset, ``x-prefixpin-parent: <A's lineage>``), its key in the same place
    as A's (or both without a key): B's request is a root, forwarded with B's own
    system and tools[], nothing of A's."""
    secret_system, secret_tool = f"VICTIM-SYSTEM-{place[1]}", f"VICTIM-TOOL-{place[1]}"
    a_system = hermes.system_prompt(minute="02:30 PM", session="20260513_204511_aaaaaa", extra=secret_system)
    first = _post(marker_proxy, place, "sk-victim-AAAA", hermes.request(a_system, [USER1], _victim_tools(secret_tool)))
    lineage = first.headers["x-prefixpin-lineage"]
    history = [USER1, _reply(first)]
    b_system = hermes.system_prompt(minute="03:10 PM", session="20260514_091500_bbbbbb", skills=hermes.SKILLS_REVIEW)
    attempts: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
        "marker": (
            hermes.request(b_system, [*history, {"role": "user", "content": f"{MARKER}: review"}], hermes.tools_full()),
            {},
        ),
        "tools_subset": (
            hermes.request(
                b_system, [*history, {"role": "user", "content": hermes.REVIEW_PROMPT}], hermes.tools_review()
            ),
            {},
        ),
        "parent_header": (
            hermes.request(b_system, [*history, {"role": "user", "content": "go on"}], hermes.tools_full()),
            {"x-prefixpin-parent": lineage},
        ),
    }
    for signal, (body, headers) in attempts.items():
        r = _post(marker_proxy, place, f"sk-other-{signal}", body, headers)  # a fresh tenant B each time
        sent = recorder.bodies()[-1]
        assert r.headers["x-prefixpin-role"] == "root", (signal, r.headers)
        assert secret_system.encode() not in sent and secret_tool.encode() not in sent, signal
        assert b"02:30 PM" not in sent and b"aaaaaa" not in sent, signal
        forwarded = orjson.loads(sent)
        assert [t["function"]["name"] for t in forwarded["tools"]] == [t["function"]["name"] for t in body["tools"]]
        assert "03:10 PM" in forwarded["messages"][0]["content"], signal


def test_the_same_key_in_another_place_is_another_tenant(marker_proxy: str, recorder: Recorder) -> None:
    """Documented behaviour: the place is part of the tenant, so a client keeps its
    lineages only while it keeps sending its key the same way."""
    system = hermes.system_prompt(minute="02:30 PM")
    first = _post(marker_proxy, ("header", "x-goog-api-key"), "sk-same", hermes.request(system, [USER1]))
    history = [USER1, _reply(first), {"role": "user", "content": "x"}]
    nxt = hermes.request(hermes.system_prompt(minute="02:31 PM"), history)
    again = _post(marker_proxy, ("header", "x-goog-api-key"), "sk-same", nxt)
    elsewhere = _post(marker_proxy, ("param", "key"), "sk-same", nxt)
    assert again.headers["x-prefixpin-role"] == "continuation"
    assert elsewhere.headers["x-prefixpin-role"] == "root"


def test_shared_anonymous_tenant_is_opt_in(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """``tenancy.anonymous: shared`` (a trusted sidecar): requests without any key
    continue each other, as before."""
    proxy = serve(recorder.base, write_config({"tenancy": {"anonymous": "shared"}}))
    first = _post(proxy, ("none", ""), "", hermes.request(hermes.system_prompt(minute="02:30 PM"), [USER1]))
    history = [USER1, _reply(first), {"role": "user", "content": "next"}]
    second = _post(proxy, ("none", ""), "", hermes.request(hermes.system_prompt(minute="02:31 PM"), history))
    assert second.headers["x-prefixpin-role"] == "continuation"
    assert b"02:30 PM" in recorder.bodies()[-1]


def test_two_4mb_requests_of_another_key_do_not_evict_a_lineage(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """The reported scenario (memory store, 200k entries): two 4 MB requests of many
    small messages from another key used to record a link per message and push the
    victim's lineage out of the LRU.  ``limits.canonicalize_max_bytes`` is raised
    past them: at its 4 MiB default they are forwarded unparsed and record nothing."""
    proxy = serve(recorder.base, write_config({"limits": {"canonicalize_max_bytes": 8 * 2**20}}))
    victim = ("header", "authorization")
    first = _post(
        proxy,
        victim,
        "sk-victim",
        hermes.request(hermes.system_prompt(minute="02:30 PM"), [USER1], hermes.tools_full()),
    )
    for n in range(2):
        flood = [{"role": "user", "content": f"{n}-{i:07d}"} for i in range(115_000)]
        body = hermes.request("You are a noisy neighbour.", flood)
        assert len(orjson.dumps(body)) > 4_000_000
        reply = _reply(_post(proxy, ("header", "authorization"), "sk-noisy", body))
        # A body this big is recorded in a task, after its response: until the noisy key's
        # next turn continues the flood, that is until the flood's record has landed.
        nxt = hermes.request("You are a noisy neighbour.", [*flood, reply, {"role": "user", "content": "more"}])

        def continues(nxt: dict[str, Any] = nxt) -> bool:
            role = _post(proxy, ("header", "authorization"), "sk-noisy", nxt).headers["x-prefixpin-role"]
            return role == "continuation"

        wait_until(continues, timeout=30, interval=0.2, message="the flood's record landed")
    history = [USER1, _reply(first), {"role": "user", "content": "And now the tests?"}]
    second = _post(
        proxy,
        victim,
        "sk-victim",
        hermes.request(hermes.system_prompt(minute="02:31 PM"), history, hermes.tools_full()),
    )
    assert second.headers["x-prefixpin-role"] == "continuation"
    assert second.headers["x-prefixpin-lineage"] == first.headers["x-prefixpin-lineage"]
    assert b"02:30 PM" in recorder.bodies()[-1]


def test_model_names_the_upstream_refused_take_no_label_slot(serve: Callable[..., str], recorder: Recorder) -> None:
    """A client sending 60 made-up model names (the upstream answers 404) used to
    take all 50 ``model`` label slots; the next real model was counted as other."""
    proxy = serve(recorder.base)
    key = ("header", "authorization")
    http = track(httpx.Client(trust_env=False, timeout=30))
    recorder.control(status=404)
    for i in range(60):
        r = http.post(
            proxy + "/v1/chat/completions",
            headers={"authorization": "Bearer sk-junk"},
            json={"model": f"junk-{i}", "messages": [USER1]},
        )
        assert r.status_code == 404
    recorder.control()
    _post(proxy, key, "sk-real", {"model": "real-model", "messages": [USER1]})
    metrics = http.get(proxy + "/metrics").text
    assert 'prefixpin_prompt_tokens_total{model="real-model",role="root"}' in metrics
    assert "junk-" not in metrics


def test_query_keys_are_not_in_the_access_log(
    serve: Callable[..., str], recorder: Recorder, log_dir: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    last = '"GET /v1/models?access_token=*** HTTP/1.1" 200'  # the access line of the last request
    logged = prefixpin_logs(log_dir).count(last)
    proxy = serve(recorder.base, write_config({"log": {"level": "debug", "access": True}}))
    secret = "sk-QUERY-SECRET-do-not-log-77"
    http = track(httpx.Client(trust_env=False, timeout=30))
    for param in ("key", "api_key", "api-key", "access_token"):
        r = http.post(proxy + f"/v1/chat/completions?api-version=1&{param}={secret}", json={"messages": [USER1]})
        assert r.status_code == 200
        assert http.get(proxy + f"/v1/models?{param}={secret}").status_code == 200
    assert recorder.requests()[0]["query"] == f"api-version=1&key={secret}"  # forwarded, of course
    wait_until(lambda: prefixpin_logs(log_dir).count(last) > logged, message="the last request's access line")
    logs = "".join(log.read_text(errors="replace") for log in log_dir.glob("prefixpin-*.log"))
    assert "key=***" in logs and "access_token=***" in logs  # the access log ran and redacted
    assert secret not in logs
