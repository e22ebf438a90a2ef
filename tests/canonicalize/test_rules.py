"""canonicalize.rules: compile_rule and Rule, through their public behaviour."""

from __future__ import annotations

import re

import pytest

from canonicalize.rules import Rule, RuleError, compile_rule

# Text a rule must never disturb: indentation, runs of spaces, tabs, numbers on
# other lines, trailing whitespace, CRLF, non-ASCII.
CODE = (
    "def f(x):\n"
    "    if x  >  10:\n"
    "\treturn   x * 2   \n"
    "        # 2026-05-14 was a Thursday; 1,085 / 2,200\r\n"
    "    return 0.5e-3  # ≈ ½\n"
)


def _wrap(line: str) -> str:
    return CODE + line + "\n" + CODE


# -- actions ---------------------------------------------------------------------
def test_strip_removes_the_whole_match() -> None:
    rule = compile_rule("clock", r" \(at \d{2}:\d{2}\)", "strip")
    assert rule.apply("Status (at 14:30) ok") == "Status ok"
    assert rule.static


def test_mask_replaces_with_the_default_constant() -> None:
    rule = compile_rule("nonce", r"nonce=[0-9a-f]{8}", "mask")
    assert rule.apply("a nonce=deadbeef b") == "a <masked> b"


def test_mask_uses_the_given_replacement_verbatim() -> None:
    # The replacement is a constant, not a re.sub template: backslashes and
    # group references stay literal.
    rule = compile_rule("nonce", r"nonce=(?P<x>[0-9a-f]{8})", "mask", replacement=r"nonce=\g<x>\1$0")
    assert rule.apply("nonce=deadbeef") == r"nonce=\g<x>\1$0"


def test_date_is_a_pin_on_the_date_group() -> None:
    # A date rule keeps the lineage's first date (like a pin); it never cuts text itself.
    rule = compile_rule("today", r"(?P<date>\d{4}-\d{2}-\d{2})T\d{2}:\d{2}(?::\d{2})?Z?", "date")
    assert not rule.static
    text = "a 2026-05-14T14:30 b 2026-05-15T09:01:02 c"
    assert rule.apply(text) == text
    assert [text[s:e] for s, e in rule.spans(text)] == ["2026-05-14", "2026-05-15"]


def test_date_without_a_date_group_spans_the_match() -> None:
    rule = compile_rule("today", r"\d{4}-\d{2}-\d{2}", "date")
    assert [m for m in rule.spans("on 2026-05-14.")] == [(3, 13)]


def test_pin_is_not_static_and_apply_leaves_text_alone() -> None:
    rule = compile_rule("sid", r"^Session ID: (?P<v>\S+)$", "pin")
    text = "Session ID: 20260513_204511_d02a5d"
    assert not rule.static
    assert rule.apply(text) == text


# -- the v group -----------------------------------------------------------------
def test_v_group_restricts_strip_to_that_part() -> None:
    rule = compile_rule("counter", r"^MEMORY(?P<v> \[\d+%\])$", "strip")
    assert rule.apply("MEMORY [49%]\nMEMORY [49%] trailing") == "MEMORY\nMEMORY [49%] trailing"


def test_v_group_restricts_mask_to_that_part() -> None:
    rule = compile_rule("build", r"build=(?P<v>[0-9a-f]{7})\b", "mask", replacement="X")
    assert rule.apply("v1 build=abc1234 ok") == "v1 build=X ok"


def test_v_group_wins_over_the_date_group() -> None:
    rule = compile_rule("started", r"^Started: (?P<v>(?P<date>\d{4}-\d{2}-\d{2}) \d{2}:\d{2})$", "date")
    text = "Started: 2026-05-14 14:30"
    assert [text[s:e] for s, e in rule.spans(text)] == ["2026-05-14 14:30"]


def test_v_group_that_does_not_participate_leaves_the_match_alone() -> None:
    rule = compile_rule("opt", r"^Build(?: id (?P<v>\d+))?!$", "strip")
    assert rule.apply("Build!\nBuild id 42!") == "Build!\nBuild id !"


# -- spans (pin rules) -------------------------------------------------------------
def test_spans_are_the_v_group() -> None:
    rule = compile_rule("sid", r"^Session ID: (?P<v>\d{8}_\d{6}_[0-9a-f]{6,8})$", "pin", identity=True)
    text = "Intro\nSession ID: 20260513_204511_d02a5d\nModel: x"
    spans = rule.spans(text)
    assert [text[s:e] for s, e in spans] == ["20260513_204511_d02a5d"]
    assert rule.identity


def test_spans_are_the_whole_match_without_v() -> None:
    rule = compile_rule("iso", r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", "pin")
    text = "a 2026-05-14T14:30 b 2026-05-15T09:00"
    assert [text[s:e] for s, e in rule.spans(text)] == ["2026-05-14T14:30", "2026-05-15T09:00"]


def test_spans_skip_matches_where_v_is_absent() -> None:
    rule = compile_rule("opt", r"^Build(?: id (?P<v>\d+))?!$", "pin")
    text = "Build!\nBuild id 42!"
    assert [text[s:e] for s, e in rule.spans(text)] == ["42"]


def test_no_spans_when_nothing_matches() -> None:
    rule = compile_rule("sid", r"^Session ID: (?P<v>\S+)$", "pin")
    assert rule.spans(CODE) == []


# -- rules touch only what they match ------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "line", "expected"),
    [
        (compile_rule("s", r" \[\d+%\]$", "strip"), "MEMORY [49%]", "MEMORY"),
        (compile_rule("m", r"cch=[0-9a-f]{5};", "mask"), "x cch=71fea; y", "x <masked> y"),
    ],
    ids=["strip", "mask"],
)
def test_rules_leave_unmatched_text_byte_identical(rule: Rule, line: str, expected: str) -> None:
    assert rule.apply(CODE) == CODE
    assert rule.apply(_wrap(line)) == _wrap(expected)


def test_multiline_is_the_default_flag() -> None:
    rule = compile_rule("s", r"^Drop me$\n", "strip")
    assert rule.apply("keep\nDrop me\nkeep") == "keep\nkeep"


def test_flags_can_be_overridden() -> None:
    rule = compile_rule("s", r"^Drop me$\n", "strip", flags=0)
    assert rule.apply("keep\nDrop me\nkeep") == "keep\nDrop me\nkeep"


def test_zero_width_matches_never_rewrite() -> None:
    # A lookaround-only pattern passes the empty-string check but matches no text:
    # it must not insert its replacement at every position.
    boundary = compile_rule("b", r"\b", "mask")
    ahead = compile_rule("a", r"(?=Session)", "mask")
    assert boundary.apply("ab cd") == "ab cd"
    assert ahead.apply("Session ID: 1") == "Session ID: 1"
    assert compile_rule("p", r"(?<=ID: )", "pin").spans("Session ID: 1") == []


def test_empty_v_group_is_not_a_span() -> None:
    rule = compile_rule("n", r"^Count: (?P<v>\d*)$", "mask")
    assert rule.apply("Count: \nCount: 7") == "Count: \nCount: <masked>"
    pin = compile_rule("n", r"^Count: (?P<v>\d*)$", "pin")
    assert pin.spans("Count: ") == []


# -- errors ------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["(unclosed", "[a-", "a{2,1}", "(?P<v>x)(?P<v>y)"])
def test_bad_regex(pattern: str) -> None:
    with pytest.raises(RuleError, match="pattern does not compile"):
        compile_rule("bad", pattern, "strip")


@pytest.mark.parametrize("pattern", ["", "x*", "^", "$", "(?:abc)?", r"\s*", "(?P<v>)"])
def test_pattern_matching_the_empty_string(pattern: str) -> None:
    with pytest.raises(RuleError, match="matches the empty string"):
        compile_rule("empty", pattern, "mask")


def test_pattern_must_be_a_string() -> None:
    with pytest.raises(RuleError, match="pattern must be a string"):
        compile_rule("n", None, "strip")  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["delete", "", "PIN", "replace"])
def test_unknown_action(action: str) -> None:
    with pytest.raises(RuleError, match=r"action must be one of pin, strip, mask, date, not"):
        compile_rule("x", "abc", action)


def test_unknown_scope() -> None:
    with pytest.raises(RuleError, match=r"scope must be one of system, tools, all, not 'user'"):
        compile_rule("x", "abc", "strip", "user")


@pytest.mark.parametrize("action", ["strip", "mask"])
def test_identity_only_on_pin(action: str) -> None:
    with pytest.raises(RuleError, match="identity: true is only meaningful on a pin rule"):
        compile_rule("x", "abc", action, identity=True)


def test_identity_date_rule_is_rejected() -> None:
    with pytest.raises(RuleError, match="identity"):
        compile_rule("x", "(?P<date>abc)", "date", identity=True)


@pytest.mark.parametrize("name", ["", None])
def test_name_is_required(name: str) -> None:
    with pytest.raises(RuleError, match="non-empty name"):
        compile_rule(name, "abc", "strip")


def test_rule_error_is_a_value_error() -> None:
    assert issubclass(RuleError, ValueError)


def test_rule_validates_when_built_directly() -> None:
    with pytest.raises(RuleError, match="action must be one of"):
        Rule("x", re.compile("abc"), "nope")  # type: ignore[arg-type]


def test_rules_are_frozen() -> None:
    rule = compile_rule("x", "abc", "strip")
    with pytest.raises(AttributeError):
        rule.name = "y"  # type: ignore[misc]


@pytest.mark.parametrize("scope", ["system", "tools", "all"])
def test_scope_is_kept(scope: str) -> None:
    assert compile_rule("x", "abc", "strip", scope).scope == scope
