"""Hermes conversations, their turns and a review fork each, sent through one or
several prefixpin processes: the same trace every time, so what the upstream
receives can be compared byte for byte between setups (one process on standalone
Redis, several on a cluster)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests import hermes

SESSIONS = ["20260513_204511_9e319e", "20260514_081502_1a2b3c", "20260515_120000_abcdef"]


@dataclass
class Conversation:
    """One agent's session: its history as the agent replays it."""

    n: int
    history: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0

    def system(self, minute: int) -> dict[str, Any]:
        text = hermes.system_prompt(minute=f"02:{30 + minute:02d} PM", session=SESSIONS[self.n % len(SESSIONS)])
        return {"role": "system", "content": text}


@dataclass
class Talk:
    """Sends each request to the next of ``bases`` (round robin)."""

    bases: Sequence[str]
    key: str = "sk-trace"
    roles: list[str] = field(default_factory=list)
    lineages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._next = itertools.cycle(self.bases)

    def send(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> httpx.Response:
        base = next(self._next)
        body = {"model": "tiny", "messages": messages, "tools": tools, "max_tokens": 4}
        headers = {"authorization": f"Bearer {self.key}"}
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30, trust_env=False)
        r.raise_for_status()
        self.roles.append(r.headers["x-prefixpin-role"])
        self.lineages.append(r.headers.get("x-prefixpin-lineage", ""))
        return r

    def turn(self, c: Conversation, user: str | None = None) -> str:
        """One turn of ``c``: the user's message, the reply replayed next turn."""
        c.history.append({"role": "user", "content": user or f"conversation {c.n}, step {c.turns}: go on."})
        r = self.send([c.system(c.turns), *c.history], hermes.tools_full())
        msg = r.json()["choices"][0]["message"]
        c.history.append({"role": "assistant", "content": msg.get("content") or ""})
        c.turns += 1
        return self.roles[-1]

    def fork(self, c: Conversation) -> str:
        """A review sub-agent replaying ``c``'s conversation (hermes' fork)."""
        system = hermes.system_prompt(minute="02:31 PM", session="20260516_093000_fedcba", skills=hermes.SKILLS_REVIEW)
        messages = [
            {"role": "system", "content": system},
            *c.history,
            {"role": "user", "content": hermes.REVIEW_PROMPT},
        ]
        self.send(messages, hermes.tools_review())
        return self.roles[-1]


def trace(talk: Talk, conversations: int = 6, turns: int = 4) -> list[str]:
    """``conversations`` conversations interleaved turn by turn, a fork of each after
    its second turn; returns the roles."""
    convs = [Conversation(n) for n in range(conversations)]
    for t in range(turns):
        for c in convs:
            talk.turn(c)
            if t == 1:
                talk.fork(c)
    return talk.roles
