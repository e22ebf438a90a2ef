"""The conversation mix continues its conversations: turn k is turn k-1 plus the
upstream's reply plus a new user message, sent ``conversations`` requests later, and
each pass over the templates is a new set of sessions (benchmarks/overhead/mix.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.overhead import mix, nginx, workloads


def test_each_turn_replays_the_previous_one_with_the_reply_and_a_new_question() -> None:
    turns = mix.conversation(5, 4)
    for k in range(1, 4):
        prev, cur = turns[k - 1]["messages"], turns[k]["messages"]
        assert cur[1 : len(prev)] == prev[1:]  # the history, byte for byte (system aside)
        assert cur[len(prev)] == {"role": "assistant", "content": mix.REPLY}
        assert cur[-1]["role"] == "user" and len(cur) == len(prev) + 2
        assert f"02:{30 + k} PM" in cur[0]["content"]  # the pre-fix per-turn minute moved
    assert json.loads(nginx.reply())["choices"][0]["message"]["content"] == mix.REPLY


def test_requests_go_round_robin_and_each_pass_is_new_sessions(tmp_path: Path) -> None:
    w = workloads.conversations(tmp_path, conversations=3, turns=2)
    sent = [json.loads(w.render(n)) for n in range(12)]  # two passes of 3 conversations x 2 turns
    assert [len(b["messages"]) for b in sent[:6]] == [len(b["messages"]) for b in sent[6:]]
    for n in range(3, 6):  # turn 1 of conversation n - 3 continues request n - 3
        assert sent[n]["messages"][1:-2] == sent[n - 3]["messages"][1:]

    def session(b: dict[str, object]) -> str:
        text = json.dumps(b)
        found = re.search(r"Session ID: (\d{8}_\d{6}_[0-9a-f]{6})", text)
        assert found is not None
        return found.group(1)

    assert session(sent[0]) == session(sent[3]) != session(sent[6])
    assert sent[0]["messages"][1] != sent[6]["messages"][1]  # the opening task differs too
    assert len({session(b) for b in sent[:3]}) == 3
