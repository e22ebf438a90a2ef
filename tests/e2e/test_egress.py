"""Real upstreams as users reach them: HTTPS with a private CA (trusted through
``SSL_CERT_FILE`` or ``upstream.tls.ca_file``), mutual TLS, a wrong CA, and an
egress proxy (Debian's tinyproxy, through ``HTTPS_PROXY`` or ``upstream.proxy``,
``NO_PROXY`` honoured) — each through a real ``prefixpin serve``, streamed and not,
with the openai SDK as the client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import track
from tests.infra import rawupstream as raw
from tests.infra.procs import Proc, closed_port, free_port, start_prefixpin
from tests.infra.tinyproxy import Tinyproxy
from tests.infra.tls import Pair, issue, make_ca, server_context

pytestmark = pytest.mark.e2e

SECRET = "pw-SECRET-7c1b"
NO_ENV = {  # the machine's own proxy settings must not steer these tests
    "HTTPS_PROXY": "",
    "https_proxy": "",
    "HTTP_PROXY": "",
    "http_proxy": "",
    "ALL_PROXY": "",
    "all_proxy": "",
    "NO_PROXY": "",
    "no_proxy": "",
    "SSL_CERT_FILE": "",
    "SSL_CERT_DIR": "",
}
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(folder, "prefixpin test CA"), make_ca(folder, "some other CA")
    return {
        "ca": ca,
        "other": other,
        "server": issue(ca, folder, "upstream"),
        "client": issue(ca, folder, "prefixpin client", client=True),
    }


@pytest.fixture
def https_upstream(pki: dict[str, Pair]) -> Iterator[raw.RawUpstream]:
    up = raw.RawUpstream(_answer, tls=server_context(pki["server"]))
    yield up
    up.close()


@pytest.fixture
def mtls_upstream(pki: dict[str, Pair]) -> Iterator[raw.RawUpstream]:
    up = raw.RawUpstream(_answer, tls=server_context(pki["server"], client_ca=pki["ca"]))
    yield up
    up.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Callable[..., Tinyproxy]]:
    started: list[Tinyproxy] = []

    def start(**auth: str) -> Tinyproxy:
        t = Tinyproxy(tmp_path / f"proxy-{len(started)}", **auth)
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()


@pytest.fixture
def prefixpin(log_dir: Path, tmp_path: Path) -> Iterator[Callable[..., tuple[str, Proc]]]:
    procs: list[Proc] = []

    def start(
        upstream: str, config: dict[str, Any] | None = None, env: dict[str, str] | None = None
    ) -> tuple[str, Proc]:
        path = None
        if config is not None:
            path = tmp_path / f"config-{free_port()}.yaml"
            path.write_text(yaml.safe_dump(config))
        proc, base = start_prefixpin(
            log_dir, upstream=upstream, config=path, env={**NO_ENV, **(env or {})}, name=f"prefixpin-{free_port()}"
        )
        procs.append(proc)
        return base, proc

    yield start
    for proc in procs:
        proc.stop()


def _answer(conn: raw.Conn) -> None:
    """A chat completions upstream: JSON, or an SSE stream when asked."""
    while (req := conn.read_request()) is not None:
        stream = b'"stream":true' in req.body.replace(b" ", b"")
        conn.send(raw.sse_response(raw.STREAM_EVENTS) if stream else raw.json_response())


def _chat(base: str, *, stream: bool) -> str:
    client = track(openai.OpenAI(base_url=base + "/v1", api_key="sk-egress", max_retries=0))
    if stream:
        parts = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    reply = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def _post(base: str) -> httpx.Response:
    body = {"model": "m", "messages": MESSAGES}
    return httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}, timeout=30)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_private_ca_trusted_through_ssl_cert_file(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any, stream: bool
) -> None:
    base, _ = prefixpin(https_upstream.url, env={"SSL_CERT_FILE": str(pki["ca"].cert)})
    assert _chat(base, stream=stream) == "ok"
    assert len(https_upstream.requests) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_private_ca_trusted_through_upstream_tls_ca_file(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any, stream: bool
) -> None:
    base, _ = prefixpin(https_upstream.url, config={"upstream": {"tls": {"ca_file": str(pki["ca"].cert)}}})
    assert _chat(base, stream=stream) == "ok"
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 200  # passthrough, same TLS


def test_a_wrong_ca_is_a_502_that_names_tls_and_no_secret(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    url = https_upstream.url.replace("https://", f"https://alice:{SECRET}@") + f"/v1?api_key={SECRET}"
    base, proc = prefixpin(url, config={"upstream": {"tls": {"ca_file": str(pki["other"].cert)}}})
    r = _post(base)
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "TLS certificate verification failed for host localhost" in message, message
    ready = httpx.get(base + "/readyz", timeout=10)
    assert ready.status_code == 503 and "TLS certificate verification failed" in ready.text
    assert SECRET not in r.text + ready.text + proc.log_tail(400)
    metrics = httpx.get(base + "/metrics", timeout=10).text
    assert 'prefixpin_upstream_errors_total{kind="tls"} 1.0' in metrics or 'kind="tls"} 2.0' in metrics
    assert https_upstream.requests == []


def test_verify_false_reaches_an_untrusted_upstream_and_says_so(
    https_upstream: raw.RawUpstream, prefixpin: Any
) -> None:
    base, proc = prefixpin(https_upstream.url, config={"upstream": {"tls": {"verify": False}}})
    assert _chat(base, stream=False) == "ok"
    assert "upstream.tls.verify is false" in proc.log_tail(100)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_mutual_tls_with_a_client_certificate(
    mtls_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any, stream: bool
) -> None:
    tls = {"ca_file": str(pki["ca"].cert), "cert_file": str(pki["client"].cert), "key_file": str(pki["client"].key)}
    base, _ = prefixpin(mtls_upstream.url, config={"upstream": {"tls": tls}})
    assert _chat(base, stream=stream) == "ok"


def test_mutual_tls_without_a_client_certificate_is_a_502_naming_tls(
    mtls_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    base, _ = prefixpin(mtls_upstream.url, config={"upstream": {"tls": {"ca_file": str(pki["ca"].cert)}}})
    r = _post(base)
    assert r.status_code == 502 and "TLS" in r.json()["error"]["message"], r.text
    assert mtls_upstream.requests == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_https_through_tinyproxy_named_by_https_proxy(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], proxy: Any, prefixpin: Any, stream: bool
) -> None:
    tp = proxy()
    base, _ = prefixpin(https_upstream.url, env={"HTTPS_PROXY": tp.url, "SSL_CERT_FILE": str(pki["ca"].cert)})
    assert _chat(base, stream=stream) == "ok"
    assert f"CONNECT localhost:{https_upstream.port}" in tp.log_text()


def test_https_through_upstream_proxy_with_credentials_that_are_never_printed(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], proxy: Any, prefixpin: Any
) -> None:
    tp = proxy(user="relay", password=SECRET)
    config = {"upstream": {"proxy": tp.url, "tls": {"ca_file": str(pki["ca"].cert)}}, "log": {"level": "debug"}}
    base, proc = prefixpin(https_upstream.url, config=config)
    assert _chat(base, stream=False) == "ok"
    assert f"CONNECT localhost:{https_upstream.port}" in tp.log_text()
    shown = httpx.get(base + "/metrics", timeout=10).text + proc.log_tail(400)
    assert SECRET not in shown


def test_a_proxy_that_refuses_the_credentials_is_a_502_naming_the_proxy(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], proxy: Any, prefixpin: Any
) -> None:
    tp = proxy(user="relay", password="right")
    wrong = tp.url.replace("relay:right@", f"relay:{SECRET}@")
    base, proc = prefixpin(
        https_upstream.url, config={"upstream": {"proxy": wrong, "tls": {"ca_file": str(pki["ca"].cert)}}}
    )
    r = _post(base)
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert f"egress proxy http://127.0.0.1:{tp.port}" in message and ("407" in message or "401" in message), (
        message
    )  # tinyproxy answers 401
    assert SECRET not in r.text + proc.log_tail(400)


def test_plain_http_through_http_proxy(proxy: Any, prefixpin: Any) -> None:
    up = raw.RawUpstream(_answer)
    try:
        tp = proxy()
        base, _ = prefixpin(up.url, env={"HTTP_PROXY": tp.url})
        assert _chat(base, stream=True) == "ok"
        assert f"GET http://127.0.0.1:{up.port}" not in tp.log_text()
        assert f"POST http://127.0.0.1:{up.port}/v1/chat/completions" in tp.log_text()
        assert up.requests[0].line.startswith(b"POST /v1/chat/completions ")  # origin-form at the upstream
    finally:
        up.close()


def test_no_proxy_reaches_the_upstream_directly(
    https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any
) -> None:
    with closed_port() as port:  # nothing listens there
        env = {
            "HTTPS_PROXY": f"http://127.0.0.1:{port}",
            "NO_PROXY": "example.com,localhost",
            "SSL_CERT_FILE": str(pki["ca"].cert),
        }
        base, _ = prefixpin(https_upstream.url, env=env)
        assert _chat(base, stream=False) == "ok"


def test_a_dead_proxy_is_a_502_naming_it(https_upstream: raw.RawUpstream, pki: dict[str, Pair], prefixpin: Any) -> None:
    with closed_port() as port:  # nothing listens there
        base, _ = prefixpin(https_upstream.url, env={"HTTPS_PROXY": f"http://u:{SECRET}@127.0.0.1:{port}"})
        r = _post(base)
        assert r.status_code == 502
        assert f"egress proxy http://127.0.0.1:{port}" in r.json()["error"]["message"]
        assert SECRET not in r.text
        ready = httpx.get(base + "/readyz", timeout=10)
        assert ready.status_code == 503 and "egress proxy" in ready.text


def test_every_replica_of_a_pool_gets_the_same_tls_and_proxy(pki: dict[str, Pair], proxy: Any, prefixpin: Any) -> None:
    ups = [raw.RawUpstream(_answer, tls=server_context(pki["server"])) for _ in range(2)]
    try:
        tp = proxy()
        config = {
            "upstream": {"pool": [u.url for u in ups], "proxy": tp.url, "tls": {"ca_file": str(pki["ca"].cert)}},
            "affinity": {"replicas": "round_robin"},
        }
        base, _ = prefixpin(ups[0].url, config=config)
        for _ in range(4):
            assert _chat(base, stream=False) == "ok"
        assert all(u.requests for u in ups)
        assert all(f"CONNECT localhost:{u.port}" in tp.log_text() for u in ups)
        health = httpx.get(base + "/readyz", timeout=10).json()
        assert health["status"] == "ready", json.dumps(health)
    finally:
        for u in ups:
            u.close()
