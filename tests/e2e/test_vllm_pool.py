"""prefixpin's ``upstream.pool`` in front of two real vLLM replicas (CPU build, prefix
caching on), lineage affinity: three interleaved sessions, each placed on one replica
(the least loaded when it starts) and kept there, so its later turns are served
from that replica's prefix cache.

Two vLLM processes take ~3-4 GB of RAM each and 36-99 s to start on 2 cores (they
start together); the venv and model are cached by :mod:`tests.infra.vllm`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.infra import sessions
from tests.infra.procs import Proc
from tests.infra.vllm import start_vllm, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]
BLOCK = 128  # vLLM's KV block on CPU: it caches whole blocks only


@pytest.fixture(scope="module")
def vllm_pool(log_dir: Path) -> Iterator[list[str]]:
    if os.environ.get("PREFIXPIN_SKIP_VLLM") and os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("PREFIXPIN_SKIP_VLLM is set (never honoured in CI)")
    started: list[tuple[Proc, str]] = []
    try:
        for i in range(2):
            started.append(start_vllm(log_dir, name=f"vllm-pool-{i}", wait=False))
        for proc, base in started:
            wait_ready(proc, base)
        yield [base for _, base in started]
    finally:
        for proc, _ in started:
            proc.stop(timeout=30)


def test_a_session_stays_on_one_vllm_replica_and_its_later_turns_are_cached(
    vllm_pool: list[str], serve: Callable[..., str], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    proxy = serve(vllm_pool[0], write_config({"upstream": {"pool": vllm_pool}}))
    ids, turns = sessions.session_ids(3), 4
    sent = sessions.run(proxy, ids, turns, filler=4)  # vLLM here: --max-model-len 4096
    homes: dict[str, set[str]] = {}
    for s in sent:
        homes.setdefault(s.session, set()).add(s.headers["x-prefixpin-replica"])
    assert all(len(h) == 1 for h in homes.values()), homes
    assert set(Counter(h.pop() for h in homes.values())) == {"0", "1"}  # placed by load: both serve
    assert [s.cached for s in sent[:1]] == [0]  # nothing was cached before
    previous: dict[str, int] = {}
    for s in sent:
        if s.turn:  # the session's previous prompt, but for its last partial KV block
            assert s.cached >= previous[s.session] - BLOCK, s
        previous[s.session] = s.prompt
    later = sessions.ratio(sent, from_turn=1)
    print(f"\ncached on two vLLM replicas: {sessions.ratio(sent):.3f} (later turns {later:.3f})")
