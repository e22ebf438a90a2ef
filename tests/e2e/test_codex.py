"""The real Codex CLI (``@openai/codex``, installed by scripts/test) through the real
``prefixpin serve`` in front of the recording upstream: ``codex exec`` runs a tool
loop and ``codex exec resume`` a second turn; every request after the first
continues the session's lineage, the forwarded prefix stays byte-stable, and
usage is counted."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from canonicalize import JsonDoc
from tests.conftest import Recorder

pytestmark = pytest.mark.e2e

CACHE = Path(os.environ.get("PREFIXPIN_CACHE", Path.home() / ".cache" / "prefixpin"))
CODEX = os.environ.get("PREFIXPIN_CODEX") or str(CACHE / "codex-0.169.0" / "node_modules" / ".bin" / "codex")
PATH = "/v1/responses"


def _metric(proxy: str, prefix: str) -> float:
    text = httpx.get(proxy + "/metrics", trust_env=False).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


def _input_end(raw: bytes) -> int:
    """Where the last input item of a forwarded body ends (the prefix a next turn keeps)."""
    body = orjson.loads(raw)
    span = JsonDoc(raw).span(("input", len(body["input"]) - 1))
    assert span is not None
    return span[1]


# In CI the test command installs the CLI: there a missing one fails the test instead.
@pytest.mark.skipif(
    not os.environ.get("CI") and not (os.access(CODEX, os.X_OK) or shutil.which("codex")),
    reason="codex CLI not installed (./scripts/test installs it)",
)
def test_codex_exec_session_is_one_lineage(serve: Callable[..., str], recorder: Recorder, tmp_path: Path) -> None:
    proxy = serve(recorder.base)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        'model = "m"\nmodel_provider = "pp"\n[model_providers.pp]\nname = "prefixpin"\n'
        f'base_url = "{proxy}/v1"\nwire_api = "responses"\nenv_key = "PP_KEY"\n'
    )
    env = {**os.environ, "CODEX_HOME": str(home), "PP_KEY": "sk-codex", "NO_COLOR": "1"}
    exe = CODEX if os.access(CODEX, os.X_OK) else str(shutil.which("codex"))

    def codex(*args: str) -> str:
        done = subprocess.run(
            [exe, "exec", "--skip-git-repo-check", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    # Turn 1: a tool call, then (after Codex ran it and sent its output) a message.
    call = {"name": "exec_command", "arguments": '{"cmd":"echo hi"}'}
    recorder.control(tool_calls=[call], cached=100, then={"content": "done", "cached": 200})
    assert "done" in codex("run echo hi")
    # Turn 2 of the same session.
    recorder.control(content="bye", cached=300)
    assert "bye" in codex("resume", "--last", "thanks")

    sent = recorder.bodies(PATH)
    assert len(sent) == 3
    bodies = [orjson.loads(raw) for raw in sent]
    assert len({b["prompt_cache_key"] for b in bodies}) == 1
    # Append-only and byte-stable: each request starts with the previous one's bytes
    # up to the end of its input items (model, stream, input come first).
    for before, after in itertools.pairwise(sent):
        end = _input_end(before)
        assert after[:end] == before[:end]
    assert [item.get("type") for item in bodies[1]["input"][-2:]] == ["function_call", "function_call_output"]
    assert _metric(proxy, 'prefixpin_requests_total{role="root",route="responses"') == 1
    assert _metric(proxy, 'prefixpin_requests_total{role="continuation",route="responses"') == 2
    assert _metric(proxy, 'prefixpin_cached_tokens_total{model="m",role="continuation"}') == 500
    assert _metric(proxy, 'prefixpin_prompt_tokens_total{model="m",role="root"}') > 0
