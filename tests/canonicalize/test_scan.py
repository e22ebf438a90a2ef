"""A system text analysed from its previous one, reading only the lines that differ,
is the analysis of the whole text; and the packs' rules are line-local, which is what
makes that so."""

from __future__ import annotations

import random

import pytest

from canonicalize import PACKS, RuleError, Settings, compile_rule
from canonicalize.ruleset import RuleSet
from canonicalize.scan import SystemText, rescan, scan
from tests.canonicalize.test_packs import goose_system, hermes_system, openclaw_system, opencode_system

ALL_PACKS = Settings(packs=tuple(PACKS))
PROMPTS = [
    hermes_system(),
    opencode_system(),
    goose_system(),
    openclaw_system(),
    "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=0a1b2;\nToday's date: 2026-01-08",
]
# Lines an agent's next prompt changes, adds or drops: values the rules pin or strip, and others.
VOLATILE = [
    "MEMORY (your personal notes) [50% — 1,100/2,200 chars]",
    "USER PROFILE (who the user is) [13% — 171/1,375 chars]",
    "Conversation started: Thursday, May 14, 2026 02:31 PM",
    "Session ID: 20260514_101010_abcdef",
    "Today's date: Fri Jan 02 2026",
    "CI ran at 2026-05-02T09:15:00Z and 2026-05-02 10:00",
    "Runtime: agent=main | model=gpt-5 | channel=cli",
    "a plain line — with a dash",
    "",
]


def _edit(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines) + 1)
        op = rng.randrange(5)
        if op == 0 and lines:
            del lines[min(i, len(lines) - 1)]
        elif op == 1:
            lines.insert(i, rng.choice(VOLATILE))
        elif op == 2 and lines:
            j = min(i, len(lines) - 1)
            lines[j] = lines[j][: rng.randrange(len(lines[j]) + 1)] + rng.choice(["7", " —", "", "x"])
        elif op == 3 and lines:
            lines[min(i, len(lines) - 1)] = rng.choice(VOLATILE)
        else:  # a pinned value moved in place
            lines = [ln.replace("02:30", "02:3" + str(rng.randrange(10))).replace("49%", "51%") for ln in lines]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", range(30))
def test_a_text_rescanned_from_its_previous_one_is_the_text_scanned_whole(seed: int) -> None:
    rng = random.Random(seed)
    rules = RuleSet.compile(ALL_PACKS)
    assert rules.system_lines
    text = rng.choice(PROMPTS) * rng.randint(1, 3)
    near = scan(rules, text)
    rescanned = 0
    for _ in range(20):
        new = _edit(rng, text)
        whole = scan(rules, new)
        found = rescan(rules, text, near, new)
        if found is not None:
            assert found == whole
            rescanned += 1
        text, near = new, (found or whole)
    assert rescanned >= 5  # (446 of the 600 texts over the 30 seeds)


def test_an_unchanged_prefix_and_suffix_are_not_read_again() -> None:
    """The hermes prompt whose minute moved: its memory counters, stripped before the
    change, and its session, pinned after it, are the previous analysis's, and the
    masked text (the minute masked) is the same."""
    rules = RuleSet.compile(Settings())
    old = hermes_system(started="Thursday, May 14, 2026 02:30 PM") + "\n" + "filler line\n" * 200
    new = old.replace("02:30 PM", "02:31 PM")
    near = scan(rules, old)
    found = rescan(rules, old, near, new)
    assert found == scan(rules, new)
    assert found is not None and found.masked_hash == near.masked_hash and found.fired == ("hermes.memory_usage",)
    assert [s[4] for s in found.spans if s[0].name == "hermes.conversation_started"] == [
        "Thursday, May 14, 2026 02:31 PM"
    ]


def test_a_text_no_rule_rewrites_is_handed_back_itself() -> None:
    """With no static rewrite before or in the changed lines, the text after the static
    rules is the text as sent: the object itself, which the texts memo then finds by
    identity instead of comparing a copy of it."""
    rules = RuleSet.compile(Settings())
    old = "You are a helpful agent.\nConversation started: Thursday, May 14, 2026 02:30 PM\n" + "a line\n" * 200
    new = old.replace("02:30 PM", "02:31 PM")
    found = rescan(rules, old, scan(rules, old), new)
    assert found is not None and found == scan(rules, new) and found.text is new
    rewritten = hermes_system(started="Thursday, May 14, 2026 02:30 PM")  # its memory counters are stripped
    moved = rewritten.replace("02:30 PM", "02:31 PM")
    found = rescan(rules, rewritten, scan(rules, rewritten), moved)
    assert found is not None and found == scan(rules, moved) and found.text != moved


def test_most_lines_changed_or_rules_not_line_local_are_scanned_whole() -> None:
    rules = RuleSet.compile(Settings())
    a, b = "first\n" + "x" * 100 + "\nlast", "FIRST\n" + "x" * 100 + "\nLAST"
    assert rescan(rules, a, scan(rules, a), b) is None  # the changed lines span the text
    mine = compile_rule("mine", r"secret-\d+", "mask")  # a user's rule: not assumed line-local
    user = RuleSet.compile(Settings(rules=(mine,)))
    assert not user.system_lines
    near = scan(user, a)
    assert near.rewrites is None and rescan(user, a, near, a + "!") is None
    assert scan(user, "a secret-1 b").text == "a <masked> b"


def test_a_line_local_rule_never_writes_a_newline() -> None:
    with pytest.raises(RuleError):
        compile_rule("bad", r"x", "mask", replacement="a\nb", line=True)


@pytest.mark.parametrize("name", [r.name for p in PACKS.values() for r in p.rules])
def test_every_pack_rule_finds_in_each_line_what_it_finds_in_the_whole_text(name: str) -> None:
    """What makes rescanning sound: a pack rule's spans and rewrites in a text are those
    it finds in each of its lines alone."""
    rule = next(r for p in PACKS.values() for r in p.rules if r.name == name)
    rng = random.Random(name)
    for _ in range(40):
        lines = [rng.choice([*VOLATILE, *"\n".join(PROMPTS).split("\n")]) for _ in range(rng.randint(1, 30))]
        text = "\n".join(lines)
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        by_line = [(s + a, s + b) for s, line in zip(starts, lines, strict=True) for a, b in rule.spans(line)]
        assert rule.spans(text) == by_line
        rewrites = [(s + a, s + b, new) for s, ln in zip(starts, lines, strict=True) for a, b, new in rule.rewrites(ln)]
        assert rule.rewrites(text) == rewrites
        assert all("\n" not in new for _, _, new in rewrites)


def test_the_kept_rewrites_place_the_lines_of_several_static_rules() -> None:
    """Two static rules, the second reading the first's output: the lines each
    rewrote are kept where they start in the text as sent."""
    one = compile_rule("one", r"(?P<v> \[\d+%\])$", "strip", line=True)
    two = compile_rule("two", r"^(?P<v>token=\w+)$", "mask", replacement="token=<t>", line=True)
    rules = RuleSet.compile(Settings(packs=(), rules=(one, two)))
    text = "a [1%]\ntoken=abc\nkeep\nb [22%]\ntoken=xyz [3%]"
    found = scan(rules, text)
    assert found.text == "a\ntoken=<t>\nkeep\nb\ntoken=<t>"  # the last line masked once stripped
    assert found.rewrites == ((0, 0, -5), (7, 1, 0), (22, 0, -6), (30, 0, -5), (30, 1, 0))
    assert found.fired == ("one", "two")
    for new in (text.replace("keep", "kept!"), text.replace("b [22%]", "b [23%]"), "z\n" + text):
        near: SystemText | None = rescan(rules, text, found, new)
        assert near is None or near == scan(rules, new)
