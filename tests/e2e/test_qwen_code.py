"""The real qwen-code CLI (an agent no pack knows; ``python -m tests.agents.capture``
installs it, cached in ~/.cache/prefixpin) through the real ``prefixpin serve`` with
``learn: pin``, in front of the scripted agent upstream: its next invocation drops
the date reminder from the session's first message, and the upstream receives that
message as it received it before (``learned.history``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from canonicalize import JsonDoc
from tests.agents.capture import AGENTS, APP
from tests.infra.procs import REPO, free_port
from tests.infra.redis_topologies import Cluster
from tests.infra.wait import wait_until
from tests.infra.zones import noon_zone

pytestmark = pytest.mark.e2e

AGENT = AGENTS["qwen-code"]
QWEN = AGENT.home / "node_modules" / ".bin" / "qwen"


# In CI the test command installs qwen-code: there a missing one fails the test instead.
@pytest.mark.skipif(
    not os.environ.get("CI") and not os.access(QWEN, os.X_OK),
    reason="qwen-code not installed (python -m tests.agents.capture --agent qwen-code --install)",
)
@pytest.mark.parametrize("store", ["memory", "cluster"])
def test_a_resumed_qwen_session_gets_its_first_message_as_the_upstream_saw_it(
    serve: Callable[..., str],
    write_config: Callable[[dict[str, Any]], Path],
    tmp_path: Path,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    """On the memory store, and on a Redis Cluster with each invocation through another
    ``serve`` process (the lineage, its stem and template lines found from the other)."""
    requests, port = tmp_path / "requests.jsonl", free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.infra.agent_upstream", "--port", str(port), "--out", str(requests)], cwd=REPO
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(base), message="the agent upstream did not start")
        config: dict[str, Any] = {"canonicalize": {"learn": "pin"}}
        if store == "cluster":
            cluster: Cluster = request.getfixturevalue("redis_cluster")
            cluster.flush()
            config["store"] = {"backend": "redis", "redis_url": cluster.url, "redis_mode": "cluster"}
            config["store"]["redis_nodes"] = cluster.nodes
        proxies = [serve(base, write_config(config)) for _ in range(1 if store == "memory" else 2)]
        work, home = tmp_path / "project", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        (work / "app.py").write_text(APP)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "TZ": noon_zone(),  # its invocations on one date, whenever the suite runs
            "NO_COLOR": "1",
        }
        for n, (resume, prompt) in enumerate(((False, "What does app.py do?"), (True, "Thanks."))):
            env.update(AGENT.env(proxies[n % len(proxies)], home))
            done = subprocess.run(
                AGENT.command(AGENT.home, resume, prompt),
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert done.returncode == 0, done.stderr[-2000:]
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    sent = [json.loads(line)["raw"].encode() for line in requests.read_text().splitlines()]
    main = [raw for raw in sent if b"You are Qwen Code" in raw[:4000]]
    assert len(main) >= 2
    first, resumed = main[0], main[-1]
    assert _item(resumed, 1) == _item(first, 1)  # the session's first message, as before
    assert len(orjson.loads(resumed)["messages"]) > len(orjson.loads(first)["messages"])


def _item(raw: bytes, i: int) -> bytes:
    span = JsonDoc(raw).span(("messages", i))
    assert span is not None
    return raw[span[0] : span[1]]


def _up(base: str) -> bool:
    try:
        return httpx.get(base + "/v1/models", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
