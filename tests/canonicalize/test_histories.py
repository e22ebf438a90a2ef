"""The memo of hashed histories: every answer is exactly the no-memo form's
(``chain.links``), whatever was remembered before, and it stays within its bounds."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from canonicalize import CHAT, MESSAGES, RESPONSES, chain
from canonicalize.histories import Histories


def conversation(n: int, tag: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(1, n):
        if i % 3 == 1:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "terminal", "arguments": f'{{"n": {i}}}'}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif i % 3 == 2:
            out.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i}{tag}"})
        else:
            out.append({"role": "user", "content": f"step {i}{tag}"})
    return out


OFF = Histories(enabled=False)  # remembers nothing


def check(memo: Histories, history: list[Any], prev: bytes = chain.ROOT, exchange: Any = CHAT) -> None:
    assert memo.links(exchange, history, prev) == OFF.links(exchange, history, prev)


def test_the_no_memo_form_is_chain_links_and_remembers_nothing() -> None:
    history = conversation(20)
    assert OFF.links(CHAT, history) == chain.links(CHAT, history)
    counting, hashed = hashing()
    OFF.links(counting, history)
    assert hashed == history and len(OFF) == 0


def hashing() -> tuple[Any, list[Any]]:
    """CHAT, but noting each message it hashes."""
    hashed: list[Any] = []
    real = CHAT.canonical_message

    class Counting(type(CHAT)):  # type: ignore[misc]
        def canonical_message(self, msg: Any) -> bytes:
            hashed.append(msg)
            return real(msg)

    return Counting(), hashed


def test_a_growing_conversation_reuses_its_links_and_keeps_one_entry() -> None:
    memo = Histories()
    history = conversation(30)
    for n in range(4, 31):
        check(memo, history[:n])
    assert len(memo) == 1  # each turn replaced the one it extends


def test_only_the_new_messages_are_hashed() -> None:
    memo = Histories()
    history = conversation(20)
    check(memo, history[:18])
    counting, hashed = hashing()
    assert memo.links(counting, history, chain.ROOT) == chain.links(CHAT, history)
    assert hashed == history[18:]


def test_a_turn_sent_again_with_another_last_message_hashes_only_that_one() -> None:
    memo = Histories()
    history = conversation(20)
    for i in range(3):  # a few retries (each remembered), then one more
        check(memo, [*history, {"role": "user", "content": f"attempt {i}"}])
    counting, hashed = hashing()
    again = [*history, {"role": "user", "content": "attempt 3"}]
    assert memo.links(counting, again, chain.ROOT) == chain.links(CHAT, again)
    assert hashed == again[-1:]


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(content="step 6, edited"),
        lambda m: m.update(content=None),
        lambda m: m.update(extra=1),
        lambda m: m.pop("content"),
    ],
)
def test_a_changed_message_is_hashed_again(change: Any) -> None:
    memo = Histories()
    history = conversation(20)
    check(memo, history)
    edited = copy.deepcopy(history)
    change(edited[6])
    check(memo, edited)
    check(memo, [*edited, {"role": "user", "content": "and now?"}])
    check(memo, history)  # the original is still answered right


def test_numbers_that_compare_equal_are_not_the_same_message() -> None:
    memo = Histories()
    a = [*conversation(6), {"role": "user", "content": [{"type": "image", "detail": 1}]}]
    b = [*conversation(6), {"role": "user", "content": [{"type": "image", "detail": 1.0}]}]
    c = [*conversation(6), {"role": "user", "content": [{"type": "image", "detail": True}]}]
    assert a == b == c  # as Python sees them
    for history in (a, b, c, a):
        check(memo, history)
        check(memo, [*history, {"role": "user", "content": "next"}])


def test_a_message_is_not_taken_for_a_longer_one() -> None:
    memo = Histories()
    check(memo, [*conversation(4), 1, 2])
    check(memo, [*conversation(4), 12])
    check(memo, [*conversation(4), "a", "b"])
    check(memo, [*conversation(4), "ab"])


def test_sessions_sharing_a_start_and_forks_get_their_own_links() -> None:
    memo = Histories()
    parent = conversation(12)
    sessions = [parent, conversation(12, tag=" B"), conversation(14, tag=" C")]
    fork = [*parent, {"role": "user", "content": "Review the conversation above."}]
    for history in [*sessions, fork, [*parent, {"role": "assistant", "content": "done"}], *sessions]:
        check(memo, history)


def test_a_scope_never_finds_another_scopes_histories() -> None:
    memo = Histories()
    history = conversation(20)
    assert memo.links(CHAT, history[:18], scope="tenant-a") == chain.links(CHAT, history[:18])
    counting, hashed = hashing()
    assert memo.links(counting, history, scope="tenant-b") == chain.links(CHAT, history)
    assert hashed == history  # all hashed again: nothing of tenant-a's was used
    counting, hashed = hashing()
    memo.links(counting, history, scope="tenant-a")
    assert hashed == history[18:]


def test_the_chain_start_is_part_of_the_key() -> None:
    memo = Histories()
    history = conversation(10)
    check(memo, history)
    check(memo, history, prev=b"\x01" * 16)
    check(memo, [*history, {"role": "user", "content": "more"}], prev=b"\x01" * 16)


def test_each_exchange_hashes_in_its_own_form() -> None:
    memo = Histories()
    history = conversation(10)
    for exchange in (CHAT, MESSAGES, RESPONSES, CHAT):
        check(memo, history, exchange=exchange)
        check(memo, [*history, {"role": "user", "content": "more"}], exchange=exchange)


def test_what_orjson_cannot_write_is_hashed_as_chain_links_does() -> None:
    memo = Histories()
    history = [*conversation(6), {"role": "user", "content": "x", "big": 2**70}]
    check(memo, history)
    assert len(memo) == 0


def test_bounded_in_entries_bytes_and_per_key() -> None:
    memo = Histories(max_entries=5, max_bytes=10**9, per_key=2)
    for i in range(8):  # one first message, eight different sessions
        check(memo, conversation(8, tag=f" s{i}"))
    assert len(memo) == 2
    for i in range(20):
        check(memo, [{"role": "user", "content": f"session {i}"}, *conversation(8)])
    assert len(memo) == 5

    small = Histories(max_entries=1000, max_bytes=40_000)
    for i in range(50):
        check(small, [{"role": "user", "content": f"session {i}"}, *conversation(20)])
    assert 0 < small.size <= 40_000
    assert len(small) < 50


def test_a_history_too_big_for_its_share_is_not_remembered() -> None:
    memo = Histories(max_bytes=8 * 1024)
    history = [*conversation(6), {"role": "user", "content": "x" * 2048}]
    check(memo, history)
    assert len(memo) == 0
    assert memo.size == 0


def test_short_histories_are_hashed_directly() -> None:
    memo = Histories()
    for n in range(4):
        check(memo, conversation(n))
    assert len(memo) == 0


def test_entries_hold_the_serialized_history() -> None:
    memo = Histories()
    history = conversation(9)
    memo.links(CHAT, history)
    assert memo.size >= len(orjson.dumps(history))


def test_random_histories_sharing_starts() -> None:
    """Prefixes, extensions, edits and other sessions in any order: always chain.links."""
    import random

    rnd = random.Random(15)
    memo = Histories(per_key=4)
    sessions = [conversation(40, tag=f" s{i}") for i in range(6)]
    seen: list[list[Any]] = []
    for _ in range(400):
        base = rnd.choice(sessions + seen) if seen else rnd.choice(sessions)
        history = copy.deepcopy(base[: rnd.randint(1, len(base))])
        action = rnd.random()
        if action < 0.3:
            history += [{"role": "user", "content": f"new {rnd.randint(0, 3)}"}] * rnd.randint(1, 3)
        elif action < 0.5 and len(history) > 1:
            history[rnd.randrange(1, len(history))] = {"role": "user", "content": f"edited {rnd.randint(0, 3)}"}
        elif action < 0.6:
            history.append(rnd.choice([1, 1.0, True, "1", None, [1], {"a": 1}]))
        check(memo, history)
        seen = [*seen[-20:], history]


def test_a_retried_turn_replaces_the_entry_of_the_turn_it_retries() -> None:
    memo = Histories()
    history = conversation(12)
    check(memo, history)
    for i in range(5):  # the same turn, each time with another last message
        retried = [*history[:-1], {"role": "user", "content": f"retry {i}"}]
        counting, hashed = hashing()
        assert memo.links(counting, retried, chain.ROOT) == chain.links(CHAT, retried)
        assert hashed == retried[-1:]
    assert len(memo) == 1
    check(memo, [*retried, {"role": "assistant", "content": "ok"}])  # the next turn extends the last retry
    assert len(memo) == 1


def test_a_remembered_history_differing_only_inside_its_last_bytes_is_not_reused() -> None:
    """The end of each message is compared first, then the whole prefix: a difference
    before the last 64 bytes still counts."""
    memo = Histories()
    long = "y" * 500
    history = [*conversation(6), {"role": "tool", "tool_call_id": "c9", "content": "a" + long}]
    check(memo, history)
    edited = [*conversation(6), {"role": "tool", "tool_call_id": "c9", "content": "b" + long}]
    counting, hashed = hashing()
    assert memo.links(counting, edited, chain.ROOT) == chain.links(CHAT, edited)
    assert hashed == edited[-1:]
    edited_early = [{"role": "user", "content": "Fix the failing test!"}, *conversation(8)[1:]]
    check(memo, edited_early)
