"""A two-turn hermes conversation through prefixpin with the openai SDK, for tests
that check an upstream's prefix cache through a deployed prefixpin."""

from __future__ import annotations

from typing import Any

import openai

from tests import hermes
from tests.conftest import track


def two_turns(base: str) -> tuple[Any, Any, list[str]]:
    """Two turns of a hermes conversation whose memory counter and minute change between
    turns, through prefixpin with the openai SDK; returns both usages and the roles."""
    client = track(openai.OpenAI(base_url=base + "/v1", api_key="sk-deploy", max_retries=0, timeout=120))
    tools = hermes.tools_full()
    history: list[dict[str, Any]] = []
    usages, roles = [], []
    turns = [
        (49, "1,085", "02:30 PM", "What does the test suite cover?"),
        (50, "1,102", "02:31 PM", "Run the unit tests and summarise failures."),
    ]
    for pct, chars, minute, user in turns:
        system = hermes.system_prompt(pct=pct, chars=chars, minute=minute, filler=8)
        messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": user}]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=messages,
            tools=tools,
            max_tokens=6,  # type: ignore[arg-type]
        )
        reply = raw.parse()
        usages.append(reply.usage)
        roles.append(raw.headers.get("x-prefixpin-role", ""))
        history += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
        ]
    return usages[0], usages[1], roles


def cached(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0
