"""Wire fidelity, against the real ``prefixpin serve`` and the recording upstream:
edits are spliced into the client's bytes (compared as bytes), tools[] keep the
lineage's first bytes, the response carries nothing the client did not cause,
every chat-completions route is canonicalized, and a date pin tells the model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from canonicalize import JsonDoc
from tests import hermes
from tests.conftest import Recorder, track

pytestmark = pytest.mark.e2e

KEY = {"authorization": "Bearer sk-wire", "content-type": "application/json"}


def _http() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=30)


def _metric(proxy: str, prefix: str) -> float:
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


# A hermes system prompt whose memory counter the hermes pack strips, written the
# way real clients write JSON: escapes orjson would not produce, numbers it would
# rewrite, a duplicate key, tool schema keys that are not sorted.
SYSTEM = hermes.system_prompt()
STRIPPED = SYSTEM.replace(" [49% — 1,085/2,200 chars]", "").replace(" [12% — 170/1,375 chars]", "")
assert STRIPPED != SYSTEM


def _json_str(text: str) -> bytes:
    """``text`` as json.dumps writes it (\\uXXXX for non-ASCII), with escaped slashes."""
    return json.dumps(text).replace("/", "\\/").encode()


TOOLS = (
    b'[{"type": "function", "function": {"name": "terminal", "description": "Run a command \\u00e9",'
    b' "parameters": {"type": "object", "required": ["command"], "properties": {"timeout": {"type": "integer",'
    b' "default": 0.50}, "command": {"type": "string"}}}}}]'
)


def _body(system: bytes, *, stream: bool, extra: bytes = b"") -> bytes:
    return (
        b'{"model": "m", "temperature": 0.50, "top_p": 1e0, "seed": 123456789012345678901234567890,'
        b' "x": 1, "x": 2, "messages": [{"role": "system", "content": ' + system + b"},"
        b' {"role": "user", "content": "caf\\u00e9 \\/ \\"q\\""}], "tools": '
        + TOOLS
        + extra
        + (b', "stream": true}' if stream else b"}")
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_edits_are_spliced_into_the_clients_bytes(serve: Callable[..., str], recorder: Recorder, stream: bool) -> None:
    proxy = serve(recorder.base)
    raw = _body(_json_str(SYSTEM), stream=stream)
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", content=raw, headers=KEY)
    assert r.status_code == 200, r.text
    assert r.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
    (sent,) = recorder.bodies()
    # Only the system string changed (re-encoded as that one string), plus the
    # stream_options member prefixpin adds; every other byte is the client's.
    expected = raw.replace(_json_str(SYSTEM), orjson.dumps(STRIPPED))
    if stream:
        assert expected.endswith(b"}")
        expected = expected[:-1] + b',"stream_options":{"include_usage":true}}'
    assert sent == expected


def test_streamed_response_has_no_usage_the_client_did_not_ask_for(
    serve: Callable[..., str], recorder: Recorder
) -> None:
    proxy = serve(recorder.base)
    raw = _body(_json_str("Be brief."), stream=True)
    with _http() as http, http.stream("POST", proxy + "/v1/chat/completions", content=raw, headers=KEY) as r:
        body = r.read()
        headers = r.headers
    assert b'"usage"' not in body  # neither the usage chunk nor "usage": null
    assert body.endswith(b"data: [DONE]\n\n")
    assert b'"stream_options":{"include_usage":true}' in recorder.bodies()[0]
    for name in ("date", "server", "content-type"):
        assert len(headers.get_list(name)) <= 1, name
    assert _metric(proxy, "prefixpin_prompt_tokens_total") > 0  # measured all the same


def test_client_that_asked_for_usage_gets_it(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    raw = _body(_json_str("Be brief."), stream=True, extra=b', "stream_options": {"include_usage": true}')
    with _http() as http, http.stream("POST", proxy + "/v1/chat/completions", content=raw, headers=KEY) as r:
        body = r.read()
    assert recorder.bodies() == [raw]
    assert body.count(b'"usage": null') >= 3 and b'"prompt_tokens"' in body


def test_each_response_header_appears_once(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", content=_body(b'"Be brief."', stream=False), headers=KEY)
        other = http.get(proxy + "/v1/models")
    for resp in (r, other):
        names = [k.lower() for k, _ in resp.headers.raw]
        assert len(names) == len(set(names)), names


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions/", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"],
    ids=["trailing-slash", "azure"],
)
def test_other_chat_routes_are_canonicalized_and_measured(
    serve: Callable[..., str], recorder: Recorder, path: str
) -> None:
    proxy = serve(recorder.base)
    with _http() as http:
        r = http.post(proxy + path, content=_body(_json_str(SYSTEM), stream=False), headers=KEY)
    assert r.status_code == 200, r.text
    assert r.headers["x-prefixpin-role"] == "root"
    assert r.headers["x-prefixpin-rewrites"] == "hermes.memory_usage"
    (req,) = recorder.requests()
    want_path, _, want_query = path.partition("?")
    assert (req["path"], req["query"]) == (want_path, want_query)
    assert orjson.loads(req["body"])["messages"][0]["content"] == STRIPPED
    assert _metric(proxy, 'prefixpin_requests_total{role="root",route="chat_completions",status="200"}') == 1
    assert _metric(proxy, 'prefixpin_prompt_tokens_total{model="m",role="root"}') > 0


def test_tools_meaning_the_same_get_the_lineages_first_bytes(serve: Callable[..., str], recorder: Recorder) -> None:
    proxy = serve(recorder.base)
    client = track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-wire", max_retries=0))
    first_tools: list[dict[str, Any]] = orjson.loads(TOOLS)
    msgs: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r1 = client.chat.completions.create(model="m", messages=msgs, tools=first_tools)  # type: ignore[arg-type]
    msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    # The same tool, its schema's keys in another order.
    fn = first_tools[0]["function"]
    params = {"properties": fn["parameters"]["properties"], "type": "object", "required": ["command"]}
    reordered = [
        {"function": {"parameters": params, "description": fn["description"], "name": "terminal"}, "type": "function"}
    ]
    raw2 = client.chat.completions.with_raw_response.create(model="m", messages=msgs, tools=reordered)  # type: ignore[arg-type]
    assert raw2.headers["x-prefixpin-role"] == "continuation"
    assert "lineage.tools" in raw2.headers["x-prefixpin-rewrites"]
    b1, b2 = recorder.bodies()

    def tools_of(raw: bytes) -> bytes:
        span = JsonDoc(raw).span(("tools",))
        assert span is not None
        return raw[span[0] : span[1]]

    assert tools_of(b2) == tools_of(b1)


def test_date_pin_tells_the_model(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(recorder.base, write_config({"canonicalize": {"packs": ["generic", "opencode"]}}))
    client = track(openai.OpenAI(base_url=proxy + "/v1", api_key="sk-wire", max_retries=0))

    def system(day: str) -> dict[str, str]:
        return {"role": "system", "content": f"You are opencode.\n<env>\n  Today's date: {day}\n</env>"}

    history: list[Any] = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="m", messages=[system("Thu Jan 01 2026"), *history])
    history += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "after midnight"}]
    r = client.chat.completions.create(model="m", messages=[system("Fri Jan 02 2026"), *history])
    history += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "later"}]
    client.chat.completions.create(model="m", messages=[system("Fri Jan 02 2026"), *history])
    _, second, third = (orjson.loads(b) for b in recorder.bodies())
    note = "after midnight\n\n(Note: the current date is now Fri Jan 02 2026.)"
    assert second["messages"][0]["content"].endswith("Today's date: Thu Jan 01 2026\n</env>")
    assert second["messages"][-1]["content"] == note
    assert third["messages"][0] == second["messages"][0]
    assert third["messages"][3]["content"] == note
    assert third["messages"][-1]["content"] == "later"


# -- errors in each API's own shape ---------------------------------------------------
def test_messages_route_errors_use_the_anthropic_shape(
    serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    import anthropic

    from tests.infra.procs import closed_port

    with closed_port() as port:
        proxy = serve(f"http://127.0.0.1:{port}", write_config({"limits": {"max_body_bytes": 2048}}))
        with _http() as http:
            big = http.post(proxy + "/v1/messages", content=b'{"x": "' + b"a" * 4096 + b'"}', headers=KEY)
            down = http.post(proxy + "/v1/messages", json={"model": "c", "max_tokens": 1, "messages": []}, headers=KEY)
            chat = http.post(proxy + "/v1/chat/completions", json={"model": "m", "messages": []}, headers=KEY)
        assert big.status_code == 413
        assert big.json()["type"] == "error" and big.json()["error"]["type"] == "request_too_large"
        assert down.status_code == 502
        assert down.json()["type"] == "error" and down.json()["error"]["type"] == "api_error"
        assert "127.0.0.1" not in down.text  # never the upstream's address
        assert chat.status_code == 502 and chat.json()["error"]["code"] == "upstream_unavailable"
        client = track(anthropic.Anthropic(base_url=proxy, api_key="sk-ant", max_retries=0))
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="c", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 502 and info.value.body["error"]["type"] == "api_error"  # type: ignore[index]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": "hi"}',
        b'{"model": "m", "messages": [{"role": ["system"], "content": "x"}]}',
        b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": 5}], "tools": {}}',
        b'{"model": "m", "messages": [{"role": "system", "content": 5}], "stream": "yes"}',
        b"[1, 2]",
        b"{not json",
    ],
)
def test_wrongly_typed_bodies_go_upstream_as_sent(serve: Callable[..., str], recorder: Recorder, raw: bytes) -> None:
    proxy = serve(recorder.base)
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", content=raw, headers=KEY)
    assert r.status_code < 500  # the upstream judged it; nothing of ours failed
    assert r.headers["x-prefixpin-role"] != "fail-open"
    assert recorder.bodies() == [raw]
    assert _metric(proxy, "prefixpin_fail_open_total") == 0


def test_a_body_over_canonicalize_max_bytes_goes_as_sent(
    serve: Callable[..., str], recorder: Recorder, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(recorder.base, write_config({"limits": {"canonicalize_max_bytes": 4096}}))
    raw = _body(_json_str(SYSTEM), stream=False)  # over 4 KB, with a rule that would fire
    assert len(raw) > 4096
    with _http() as http:
        r = http.post(proxy + "/v1/chat/completions", content=raw, headers=KEY)
    assert r.status_code == 200 and r.headers["x-prefixpin-role"] == "bypass"
    assert recorder.bodies() == [raw]
    assert _metric(proxy, 'prefixpin_requests_total{role="bypass",route="chat_completions",status="200"}') == 1
