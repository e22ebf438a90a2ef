"""canonicalize.predict: the parent a request is compared with, the byte prediction's
three runs, and the split of uncached tokens by cause (exact integers)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from canonicalize import UNCACHED_CAUSES, Fingerprint, Prediction, parent_of, predict, split_uncached
from canonicalize.predict import EVICTION_SLACK_TOKENS
from tests.flows import Harness, Sent

SYSTEM = "You are a careful coding agent. " * 20
TOOLS = [
    {"type": "function", "function": {"name": "shell", "description": "Run a command.", "parameters": {}}},
    {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {}}},
]


def body(history: list[dict[str, Any]], system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, *history], "tools": TOOLS, **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def cause(sent: Sent) -> str | None:
    p = prediction(sent)
    return p.cause if p is not None else None


def prediction(sent: Sent) -> Prediction | None:
    """The request against its parent, as the core made it (``Canonicalized.prediction``),
    which must be what its parts give."""
    outcome, prep = sent.outcome, sent.prep
    assert outcome.record.fingerprint is not None
    parent = parent_of(outcome, prep, sent.lookup)
    expected = (
        None if parent is None else predict(outcome.record.fingerprint, parent.fingerprint, outcome.depth, prep.sizes)
    )
    assert sent.flow.done.prediction == expected
    return expected


# -- the parent --------------------------------------------------------------------------------
def test_a_first_request_has_no_parent_even_when_another_session_opened_alike() -> None:
    h = Harness()
    h.send(body([user("hi")]), reply=assistant("hello"))
    other = h.send(body([user("hi")], system="Another agent entirely. " * 20))
    assert other.role == "root"
    assert prediction(other) is None


def test_a_root_replaying_a_recorded_history_under_an_edited_system_is_system_changed() -> None:
    h = Harness()
    h.send(body([user("fix the bug")]), reply=assistant("which bug?"))
    edited = SYSTEM.replace("careful", "meticulous", 1)
    out = h.send(body([user("fix the bug"), assistant("which bug?"), user("the flaky one")], system=edited))
    assert out.role == "root"  # another skeleton: a lineage of its own
    p = prediction(out)
    assert p is not None and p.cause == "system_changed"
    assert p.shared < len(edited) and p.broken > 0


def test_each_cause_against_the_previous_request() -> None:
    h = Harness()
    history = [user("fix the bug")]
    h.send(body(history), reply=assistant("which bug?"))
    history += [assistant("which bug?"), user("the flaky one")]
    assert cause(h.send(body(history), reply=assistant("ok"))) is None
    history += [assistant("ok"), user("go on")]
    assert cause(h.send(body(history, reasoning_effort="high"), reply=assistant("done"))) == "params_changed"
    history += [assistant("done"), user("thanks")]
    assert cause(h.send(body(history, model="m2", reasoning_effort="high"), reply=assistant("np"))) == ("model_changed")
    rewritten = [*history[:2], assistant("which bug, exactly?"), *history[3:], assistant("np"), user("more")]
    assert cause(h.send(body(rewritten, model="m2", reasoning_effort="high"))) == "history_rewritten"


def test_the_next_turn_after_a_system_edit_and_its_revert() -> None:
    """The conversation went on under another lineage (a system edit); reverting the
    edit continues the first lineage by its skeleton, but its parent is the request
    just before: the system changed again."""
    h = Harness()
    history = [user("fix the bug")]
    h.send(body(history), reply=assistant("which bug?"))
    history += [assistant("which bug?"), user("the flaky one")]
    h.send(body(history), reply=assistant("ok"))
    history += [assistant("ok"), user("go on")]
    edited = h.send(body(history, system=SYSTEM + "New rule."), reply=assistant("done"))
    assert cause(edited) == "system_changed"
    history += [assistant("done"), user("more")]
    assert cause(h.send(body(history, system=SYSTEM + "New rule."), reply=assistant("np"))) is None
    history += [assistant("np"), user("again")]
    assert cause(h.send(body(history))) == "system_changed"


def test_a_fork_that_recorded_the_reply_does_not_break_its_parents_next_turn() -> None:
    """Without replies in the trace, a fork owns the parent's last reply first; the
    parent's next turn still extends the parent's own last request."""
    h = Harness()
    history = [user("fix the bug"), assistant("which bug?"), user("the flaky one")]
    h.send(body([user("fix the bug")]), reply=assistant("which bug?"))
    h.send(body(history))
    review = [*history, assistant("fixed it"), user("Review the conversation above.")]
    fork = h.send({**body(review), "tools": TOOLS[:1]})
    assert fork.role == "fork"
    assert cause(fork) is None
    nxt = h.send(body([*history, assistant("fixed it"), user("thanks")]))
    assert nxt.role == "continuation"
    assert cause(nxt) is None


# -- the byte prediction ---------------------------------------------------------------------------
def fp(**kw: Any) -> Fingerprint:
    base: dict[str, Any] = {"model": "m", "system_blocks": ("a", "b"), "system_len": 400}
    base.update(tools="t", tools_len=100)
    return Fingerprint(**{**base, **kw})


def test_three_runs_shared_broken_new() -> None:
    sizes = [50, 60, 70, 80]
    p = predict(fp(n_messages=4), fp(n_messages=2), 2, sizes)
    assert (p.cause, p.shared, p.broken, p.new) == (None, 500 + 110, 0, 150)
    p = predict(fp(n_messages=4, system_blocks=("a", "c")), fp(n_messages=2), 2, sizes)
    assert (p.cause, p.shared, p.broken, p.new) == ("system_changed", 256, 500 + 110 - 256, 150)
    p = predict(fp(n_messages=4), fp(n_messages=3), 1, sizes)
    assert (p.cause, p.shared, p.broken, p.new) == ("history_rewritten", 550, 130, 80)
    p = predict(fp(n_messages=4, model="x"), fp(n_messages=2), 2, sizes)
    assert (p.cause, p.shared, p.broken, p.new) == ("model_changed", 0, 610, 150)
    assert p.total == p.shared + p.broken + p.new


# -- the split of uncached tokens -------------------------------------------------------------------
def test_a_request_without_a_parent_is_all_new() -> None:
    assert split_uncached(None, 1000, 0) == {"new": 1000}
    assert split_uncached(None, 1000, 200) == {"new": 800}
    assert split_uncached(None, 1000, 1000) == {}


def test_an_append_only_turn_that_hit_is_new_only() -> None:
    p = Prediction(0.9, 900, 1000, None)
    assert split_uncached(p, 1000, 900) == {"new": 100}
    assert split_uncached(p, 1000, 880) == {"new": 120}  # within the slack: the estimate's error


def test_a_break_splits_the_tail_into_new_and_the_cause() -> None:
    p = Prediction(0.2, 200, 1000, "system_changed", broken=700)
    assert split_uncached(p, 2000, 400) == {"new": 200, "system_changed": 1400}


def test_eviction_is_what_the_parent_sent_and_the_upstream_no_longer_had() -> None:
    p = Prediction(0.9, 900, 1000, None)
    assert split_uncached(p, 1000, 0) == {"new": 100, "evicted": 900}
    p = Prediction(0.5, 500, 1000, "tools_changed", broken=300)
    assert split_uncached(p, 1000, 100) == {"new": 200, "tools_changed": 300, "evicted": 400}


def test_a_small_shortfall_is_not_an_eviction() -> None:
    p = Prediction(0.99, 990, 1000, None)
    assert "evicted" not in split_uncached(p, 1000, 990 - EVICTION_SLACK_TOKENS)
    assert "evicted" not in split_uncached(Prediction(0.9, 9000, 10000, None), 10000, 8600)
    assert split_uncached(Prediction(0.02, 20, 1000, None), 1000, 5)["evicted"] == 15  # a short prompt's eviction
    assert split_uncached(Prediction(0.9, 9000, 10000, None), 10000, 7000)["evicted"] == 2000


@pytest.mark.parametrize("seed", range(20))
def test_the_parts_are_integers_that_sum_to_prompt_minus_cached(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        total = rng.randint(1, 100_000)
        shared = rng.randint(0, total)
        broken = rng.randint(0, total - shared)
        cause_ = rng.choice([None, "system_changed", "history_rewritten"])
        p = Prediction(shared / total, shared, total, cause_, broken if cause_ else 0)
        prompt = rng.randint(1, 200_000)
        cached = rng.randint(0, prompt)
        parts = split_uncached(p if rng.random() < 0.9 else None, prompt, cached)
        assert sum(parts.values()) == prompt - cached
        assert all(isinstance(v, int) and v > 0 for v in parts.values())
        assert set(parts) <= set(UNCACHED_CAUSES)
