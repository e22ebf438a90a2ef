"""What llama-server does with its slots, from successive /slots reads, and what
prefixpin then pins (proxy.upstream.slots).  The reads are shaped as llama.cpp
0c1e57098 answers them (``tools/server/server-context.cpp``: ``server_slot::to_json``)."""

from __future__ import annotations

from typing import Any

from proxy.upstream.slots import Judge, combine, parse_slots, parse_total, plan


def _read(*slots: tuple[bool, int | None, int]) -> Any:
    """``/slots`` JSON: per slot (processing, id_task or None, n_prompt_tokens)."""
    out = []
    for i, (busy, task, tokens) in enumerate(slots):
        item: dict[str, Any] = {"id": i, "n_ctx": 16384, "speculative": False, "is_processing": busy}
        if task is not None:
            item |= {"id_task": task, "n_prompt_tokens": tokens, "n_prompt_tokens_cache": 0, "params": {}}
        out.append(item)
    return out


def _judge(*reads: Any) -> list[str]:
    judge = Judge()
    got = []
    for r in reads:
        slots = parse_slots(r)
        assert slots is not None
        got.append(judge.see(slots))
    return got


FRESH = (False, None, 0)


def test_a_fresh_server_is_unknown() -> None:
    assert _judge(_read(FRESH, FRESH, FRESH, FRESH)) == ["unknown"]


def test_defaults_an_idle_slot_emptied_when_another_task_starts_clears() -> None:
    # --parallel auto (unified KV) + --cache-ram: slot 0 served lineage A, then B
    # started on slot 1: slot 0's prompt went to the RAM cache and the slot was emptied
    reads = (
        _read((False, 0, 3535), FRESH, FRESH, FRESH),
        _read((False, 0, 0), (False, 11, 3890), FRESH, FRESH),
    )
    assert _judge(*reads) == ["unknown", "clears"]


def test_clears_is_final_until_the_server_restarts() -> None:
    reads = (
        _read((False, 0, 0), (False, 11, 3890)),
        _read((False, 20, 4000), (False, 31, 4100)),  # both idle and full: concurrency, not keeping
        _read((False, 40, 4200), (False, 31, 4100)),  # slot 1 kept its prompt across task 40
        _read(FRESH, FRESH),  # restarted: task ids went back
    )
    assert _judge(*reads) == ["clears", "clears", "clears", "unknown"]


def test_fixed_slots_a_prompt_kept_while_idle_across_another_start_keeps() -> None:
    # --parallel 3 --cache-ram 0: slot 0 keeps A while B starts on slot 1
    reads = (
        _read((False, 0, 3535), FRESH, FRESH),
        _read((False, 0, 3535), (True, 11, 1024), FRESH),
    )
    assert _judge(*reads) == ["unknown", "keeps"]


def test_two_full_idle_slots_alone_prove_nothing() -> None:
    # both tasks ran at once (neither started while the other was idle): the defaults
    # show this too until the next start empties them
    reads = (
        _read((True, 0, 100), (True, 1, 100)),
        _read((False, 0, 3535), (False, 1, 3600)),
        _read((False, 0, 3535), (False, 1, 3600)),  # nothing started in between
    )
    assert _judge(*reads) == ["unknown", "unknown", "unknown"]


def test_a_slot_that_ran_a_new_task_is_not_a_kept_one() -> None:
    reads = (
        _read((False, 0, 3535), (False, 1, 3600)),
        _read((False, 12, 4000), (True, 13, 100)),  # both ran new tasks: nothing kept idle
    )
    assert _judge(*reads) == ["unknown", "unknown"]


def test_parse_refuses_what_is_not_slots() -> None:
    assert parse_slots({"error": {"code": 501}}) is None
    assert parse_slots([]) is None
    assert parse_slots([{"id": 0}]) is None
    assert parse_slots([{"id": 0, "is_processing": False, "id_task": "x", "n_prompt_tokens": 1}]) is None
    assert parse_total({"total_slots": 4, "default_generation_settings": {"n_ctx": 16384}}) == 4
    assert parse_total({"total_slots": True}) is None and parse_total([]) is None


def test_blind_then_seen_again() -> None:
    judge = Judge()
    assert judge.blind() == "blind"
    slots = parse_slots(_read((False, 0, 10), FRESH))
    assert slots is not None and judge.see(slots) == "unknown"


def test_a_pool_is_judged_by_its_replicas_together() -> None:
    assert combine(["keeps", "clears"]) == "clears"
    assert combine(["keeps", "unknown"]) == "unknown"
    assert combine(["keeps", "blind"]) == "keeps"
    assert combine(["blind", "blind"]) == "blind"


def test_the_plan() -> None:
    assert (p := plan(4, "keeps", None)).mode == "all" and p.slots == 4
    assert plan(4, "keeps", 3).slots == 3  # cut to what the server has
    assert plan(4, "clears", 4).mode == "none"
    assert plan(4, "unknown", None).mode == "careful"
    assert plan(4, "blind", None).mode == "all"  # as configured, where it cannot be seen
    assert plan("auto", "blind", 4).mode == "none"
    assert (p := plan("auto", "keeps", 3)).mode == "all" and p.slots == 3
    assert plan("auto", "keeps", None).mode == "none"  # no count yet
    assert plan("auto", "keeps", 1).mode == "none"  # nothing to choose
