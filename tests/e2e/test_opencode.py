"""The real opencode agent (``opencode-ai``, installed by scripts/test) through the
real ``prefixpin serve`` in front of the recording upstream: ``opencode run`` runs a
tool loop (the model asks for ``bash``, opencode runs it and sends the output back)
and ``opencode run --continue`` a second turn of the same session, over chat
completions with an ``@ai-sdk/openai-compatible`` provider.  Every request after the
first continues the session's lineage, the forwarded prefix (system message, tools,
earlier messages) stays byte-stable, and usage is counted.

Nothing leaves the machine: HOME and the XDG dirs are private, the models.dev fetch,
autoupdate, sharing, default plugins and LSP downloads are off, and the background
``npm install`` opencode starts in its config dir is pointed at a dead registry in
offline mode (it fails, logged as a warning, and opencode carries on)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import orjson
import pytest

from canonicalize import JsonDoc
from tests.conftest import Recorder
from tests.infra.zones import noon_zone

pytestmark = pytest.mark.e2e

CACHE = Path(os.environ.get("PREFIXPIN_CACHE", Path.home() / ".cache" / "prefixpin"))
OPENCODE = os.environ.get("PREFIXPIN_OPENCODE") or str(
    CACHE / "opencode-1.18.33" / "node_modules" / ".bin" / "opencode"
)
DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port: any outside fetch fails fast


def _metric(proxy: str, prefix: str) -> float:
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


def _span(raw: bytes, *path: str | int) -> bytes:
    span = JsonDoc(raw).span(path)
    assert span is not None, path
    return raw[span[0] : span[1]]


def _messages_end(raw: bytes) -> int:
    """Where the last message of a forwarded body ends (the prefix a next request keeps)."""
    span = JsonDoc(raw).span(("messages", len(orjson.loads(raw)["messages"]) - 1))
    assert span is not None
    return span[1]


def _env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE", "XDG_", "npm_config"))}
    return {
        **keep,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_PURE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "npm_config_registry": DEAD + "/",
        "npm_config_offline": "true",
        **{k: DEAD for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "NO_COLOR": "1",
    }


# In CI the test command installs opencode: there a missing one fails the test instead.
@pytest.mark.skipif(
    not os.environ.get("CI") and not (os.access(OPENCODE, os.X_OK) or shutil.which("opencode")),
    reason="opencode not installed (./scripts/test installs it)",
)
def test_opencode_run_session_is_one_lineage(serve: Callable[..., str], recorder: Recorder, tmp_path: Path) -> None:
    proxy = serve(recorder.base)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("the secret word is plum\n")
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow"},
        # The title agent's side request (its own system prompt) would race the first
        # turn for the recorder's script; it is a separate conversation anyway.
        "agent": {"title": {"disable": True}},
        "provider": {
            "pp": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "prefixpin",
                "options": {"baseURL": f"{proxy}/v1", "apiKey": "sk-opencode"},
                "models": {"m": {"name": "m"}},
            }
        },
        "model": "pp/m",
    }
    (work / "opencode.json").write_text(json.dumps(config))
    # opencode takes its project dir from PWD, not the cwd; its prompt's date from the
    # local time: a zone where it is noon keeps both invocations on one date (the
    # opencode pack, off by default, is what pins the date across a midnight).
    zone = noon_zone()
    env = {**_env(home), "PWD": str(work), "TZ": zone}
    exe = OPENCODE if os.access(OPENCODE, os.X_OK) else str(shutil.which("opencode"))

    def opencode(*args: str) -> str:
        done = subprocess.run(
            [exe, "run", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    # Turn 1: a bash call opencode runs, then (after it sent the output back) a message.
    call = {"name": "bash", "arguments": '{"command":"cat notes.txt","description":"Show the notes"}'}
    recorder.control(tool_calls=[call], cached=100, then={"content": "done reading", "cached": 200})
    assert "done reading" in opencode("read notes.txt")
    # Turn 2 of the same session.
    recorder.control(content="bye now", cached=300)
    assert "bye now" in opencode("--continue", "thanks")

    sent = recorder.bodies()
    assert len(sent) == 3, [orjson.loads(raw)["messages"][0]["content"][:80] for raw in sent]
    bodies = [orjson.loads(raw) for raw in sent]
    assert bodies[0]["messages"][0]["role"] == "system"
    assert f"Today's date: {datetime.now(ZoneInfo(zone)):%a %b %d %Y}" in bodies[0]["messages"][0]["content"]
    assert bodies[0]["tools"] and bodies[0]["stream"] is True
    # The tool loop: opencode ran the command and sent its output back.
    assert [m["role"] for m in bodies[1]["messages"][-2:]] == ["assistant", "tool"]
    assert "plum" in bodies[1]["messages"][-1]["content"]
    assert [m["role"] for m in bodies[2]["messages"][-2:]] == ["assistant", "user"]
    # Append-only and byte-stable: each request starts with the previous one's bytes up
    # to the end of its messages (model, max_tokens, messages come first); the system
    # message and the tools are the same bytes in every request.
    for before, after in itertools.pairwise(sent):
        end = _messages_end(before)
        assert after[:end] == before[:end]
        assert _span(after, "messages", 0) == _span(before, "messages", 0)
        assert _span(after, "tools") == _span(before, "tools")
    assert len({r["headers"].get("x-session-id") for r in recorder.requests()}) == 1
    assert _metric(proxy, 'prefixpin_requests_total{role="root",route="chat_completions"') == 1
    assert _metric(proxy, 'prefixpin_requests_total{role="continuation",route="chat_completions"') == 2
    assert _metric(proxy, 'prefixpin_cached_tokens_total{model="m",role="continuation"}') == 500
    assert _metric(proxy, 'prefixpin_prompt_tokens_total{model="m",role="root"}') > 0
    assert _metric(proxy, 'prefixpin_prompt_tokens_total{model="m",role="continuation"}') > 0
