"""Interleaved agent sessions for the affinity and pool tests.

Each session is a legacy (pre-fix) hermes-agent gateway: it rebuilds its system
prompt every turn, with a new ``Conversation started`` minute (prefixpin pins it
back to the first), and its history grows by the turn's question and reply.  Every
session starts with the same system text, as every session of one agent does.
Sessions take turns, one request at a time (``run``), the way several users'
agents reach one server: a request of one session between two of another's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from tests import hermes

OUTPUT = "".join(
    f"src/module_{i:02d}.py: {i * 37 % 400} lines, last changed by commit {i * 7919:08x}\n" for i in range(8)
)


@dataclass(frozen=True, slots=True)
class Sent:
    """One answered request."""

    session: str
    turn: int
    prompt: int
    cached: int
    headers: dict[str, str]


def body(session: str, turn: int, *, filler: int = 20, model: str = "tiny") -> dict[str, Any]:
    """Turn ``turn`` of ``session`` as the agent sends it."""
    history: list[dict[str, Any]] = []
    for t in range(turn + 1):
        history.append({"role": "user", "content": f"Step {t} of {session}: what changed?\n{OUTPUT}"})
        if t < turn:
            history.append({"role": "assistant", "content": f"Step {t}: eight files listed, none changed."})
    system = hermes.system_prompt(session=session, minute=f"02:{30 + turn:02d} PM", filler=filler)
    return hermes.request(system, history, hermes.tools_full(), max_tokens=2, model=model)


def run(
    base: str,
    sessions: Sequence[str],
    turns: int,
    *,
    filler: int = 20,
    model: str = "tiny",
    after: Callable[[Sent], None] | None = None,
) -> list[Sent]:
    """Every session's turns, sessions taking turns; ``after`` sees each answer."""
    out: list[Sent] = []
    headers = {"authorization": "Bearer sk-e2e-sessions"}
    with httpx.Client(base_url=base, timeout=300, trust_env=False, headers=headers) as client:
        for t in range(turns):
            for s in sessions:
                r = client.post("/v1/chat/completions", json=body(s, t, filler=filler, model=model))
                r.raise_for_status()
                usage = r.json()["usage"]
                details = usage.get("prompt_tokens_details") or {}
                sent = Sent(s, t, usage["prompt_tokens"], details.get("cached_tokens") or 0, dict(r.headers))
                out.append(sent)
                if after is not None:
                    after(sent)
    return out


def ratio(sent: Sequence[Sent], *, from_turn: int = 0) -> float:
    """Cached / prompt tokens over the requests of turn ``from_turn`` on."""
    picked = [s for s in sent if s.turn >= from_turn]
    return sum(s.cached for s in picked) / sum(s.prompt for s in picked)


def ctx_for(turns: int, *, filler: int = 20) -> int:
    """llama-server's ``-c`` as users size it: twice the largest request (the test
    model is byte-level, a token per byte; the JSON body is a little longer than the
    prompt), in whole 256s."""
    largest = len(orjson.dumps(body(session_ids(1)[0], turns - 1, filler=filler)))
    return 2 * largest // 256 * 256 + 256


def session_ids(n: int) -> list[str]:
    """``n`` hermes session ids (they differ late in the system prompt, as real ones do)."""
    return [f"20260514_1430{i:02d}_{i * 104729:06x}" for i in range(n)]
