"""README.md and docs/*.md: links resolve, config keys exist, and the text is for users.

- every relative link (a file, a file's ``#anchor``, a page's own ``#anchor``)
  reaches a file of the repository and a heading of it;
- every config key the docs name (`` `limits.max_body_bytes` ``, a ``yaml`` block of
  config) is a key of :class:`proxy.config.Config`'s tree;
- no text of a work diary: no issue or session numbers, no "this stop", no goal
  tables with "met"/"missed", no internal targets.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from canonicalize import PACKS
from proxy.config import Config

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
YAML_BLOCK = re.compile(r"^```ya?ml[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?P<code>.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$", re.M)
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)


def _ids(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _prose(text: str) -> str:
    """``text`` without its fenced blocks (kept as blank lines, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# -- links ----------------------------------------------------------------------------
def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, markup and punctuation
    dropped (letters, digits, ``_``, ``-`` and spaces kept), spaces as ``-``."""
    text = CODE_SPAN.sub(lambda m: m["code"], heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in "_- " or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of ``page``'s headings (a repeated one as GitHub numbers it)."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(_prose(page.read_text())):
        slug = anchor(m["text"])
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    text = _prose(page.read_text())
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    out = []
    for m in LINK.finditer(text):
        target = m["target"].strip("<>")
        if URL.match(target) or target.startswith(("mailto:", "//")):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(REPO)}:{_line(text, m.start())}: {target}"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            out.append(f"{where}: no heading #{frag} in {dest.relative_to(REPO)}")
        elif frag and dest.suffix != ".md":
            out.append(f"{where}: an anchor into a file that is not Markdown")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_anchor_is_githubs() -> None:
    assert anchor("What 0.25x nginx would take") == "what-025x-nginx-would-take"
    assert anchor("Topologies (`store.redis_mode`)") == "topologies-storeredis_mode"
    assert anchor("Record your agent, then audit it") == "record-your-agent-then-audit-it"


# -- config keys ----------------------------------------------------------------------
SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name != "environment")
KEY = re.compile(rf"^(?P<key>(?:{'|'.join(SECTIONS)})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?P<rest>.*)$", re.S)
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "toml", "lock", "gz", "html"}
# Names that look like keys and are not: the rules' names (the ``rule`` label), the
# fork repair's included (canonicalize/repair.py).
RULE_NAMES = {r.name for pack in PACKS.values() for r in pack.rules} | {"fork.system", "fork.tools", "fork.params"}


def _tree(cls: Any) -> dict[str, Any]:
    """A config dataclass's keys: each field's dataclass type, or None for a value."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else None for f in dataclasses.fields(cls)}


def config_key_problem(key: str) -> str | None:
    """Why ``key`` (``section.name[.sub]``) is not a key of the config tree; None if it is."""
    parts = key.split(".")
    node: Any = Config
    for i, part in enumerate(parts):
        if node is None:
            return None  # inside a value (a mapping such as provider_cache.prices): not walked
        keys = _tree(node)
        if part not in keys or (i == 0 and part == "environment"):
            return f"{'.'.join(parts[: i + 1])} is not a config key"
        node = keys[part]
    return None


def _python_name(dotted: str) -> bool:
    """``canonicalize.match``, ``canonicalize.learn``: a module or a name of one."""
    head, _, _ = dotted.partition(".")
    if importlib.util.find_spec(head) is None:
        return False
    try:
        if importlib.util.find_spec(dotted) is not None:
            return True
    except ModuleNotFoundError:
        pass
    module, _, name = dotted.rpartition(".")
    try:
        return importlib.util.find_spec(module) is not None and hasattr(__import__(module, fromlist=[name]), name)
    except ModuleNotFoundError:
        return False


def named_keys(page: Path) -> list[tuple[int, str]]:
    """(line, key) of every config key a code span of ``page`` names."""
    text = _prose(page.read_text())
    out = []
    for m in CODE_SPAN.finditer(text):
        k = KEY.match(m["code"].strip())
        if k is None or k["rest"][:1] in ("(", "*") or k["key"].rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue  # a call, a wildcard (``tenancy.*``), a file name
        out.append((_line(text, m.start()), k["key"]))
    return out


def _yaml_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return []
    out = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.append(key)
        out += _yaml_keys(v, key + ".")
    return out


def config_blocks(page: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, mapping) of every ``yaml`` block that is prefixpin config (its top-level
    keys are config sections)."""
    text = page.read_text()
    out = []
    for m in YAML_BLOCK.finditer(text):
        data = yaml.safe_load(m["body"])
        if isinstance(data, dict) and data and set(data) <= set(SECTIONS):
            out.append((_line(text, m.start()), data))
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_config_keys_exist(page: Path) -> None:
    problems = []
    for line, key in named_keys(page):
        why = config_key_problem(key)
        if why is not None and key not in RULE_NAMES and not _python_name(key):
            problems.append(f"{page.relative_to(REPO)}:{line}: `{key}`: {why}")
    for line, data in config_blocks(page):
        for key in _yaml_keys(data):
            why = config_key_problem(key)
            if why is not None:
                problems.append(f"{page.relative_to(REPO)}:{line}: yaml block: {why}")
    assert problems == []


def test_config_key_check_tells_keys_from_others() -> None:
    assert config_key_problem("limits.header_timeout_s") is None
    assert config_key_problem("upstream.tls.ca_file") is None
    assert config_key_problem("provider_cache.prices") is None
    assert config_key_problem("limits.header_timeout") == "limits.header_timeout is not a config key"
    assert config_key_problem("upstream.tls.ca") == "upstream.tls.ca is not a config key"
    assert _python_name("canonicalize.match") and _python_name("canonicalize.render")
    assert not _python_name("limits.header_timeout")


# -- for users, not a diary -----------------------------------------------------------
DIARY = [
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w/&`])#\d{1,5}\b"), "an issue or pull request number"),
    (re.compile(r"\b(?:session|stop|sprint|iteration)\s*#?\d+\b", re.I), "a session number"),
    (re.compile(r"\b(?:this|that|last|previous|next)\s+(?:stop|work session)\b", re.I), "a work session"),
    (re.compile(r"\bthis (?:branch|PR|pull request|commit)\b", re.I), "a branch or commit instead of a commit id"),
    (re.compile(r"\b(?:the )?(?:product|internal) target\b", re.I), "an internal target"),
    (re.compile(r"\bSPEC\b"), "a reference to the project's internal specification"),
    (re.compile(r"^#{1,6}[ \t]+.*\b(?:goals?|targets?)\b", re.I | re.M), "a goal heading"),
    (re.compile(r"^#{1,6}[ \t]+.*\bwould take\b", re.I | re.M), "a section on what a target would take"),
    # Figures carry a date and a commit; the hour of a day they were taken is a diary's.
    (re.compile(r"\b(?:morning|afternoon|evening)\b", re.I), "a time of day"),
    (re.compile(r"\b(?:the day|an hour|a day)\s+(?:before|after|later|earlier)\b", re.I), "a time of day"),
]
TABLE_ROW = re.compile(r"^\|(?P<cells>.*)\|[ \t]*$", re.M)
GOAL_CELL = re.compile(r"^(?:\*\*)?(?:met|missed|not met|partly met)\b", re.I)


def _is_header(text: str, end: int) -> bool:
    """Whether the table row ending at ``end`` is a header (the next line is ``|---|``)."""
    nxt = text[end + 1 :].split("\n", 1)[0]
    return re.fullmatch(r"\|[ :|-]+\|[ \t]*", nxt) is not None


def diary(page: Path, root: Path = REPO) -> list[str]:
    """What in ``page`` reads as a work diary rather than documentation."""
    name = page.relative_to(root)
    text = _prose(page.read_text())
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    text = URL.sub(lambda m: " " * len(m.group(0)), text)
    out = []
    for pattern, what in DIARY:
        for m in pattern.finditer(text):
            out.append(f"{name}:{_line(text, m.start())}: {what}: {m.group(0).strip()!r}")
    for row in TABLE_ROW.finditer(text):
        cells = [c.strip() for c in row["cells"].split("|")]
        if cells and cells[0].strip("* ").lower() in ("goal", "target"):
            out.append(f"{name}:{_line(text, row.start())}: a goal table")
        if _is_header(text, row.end()):
            continue  # a column may be named "missed" (what an attribution missed)
        for cell in cells:
            if GOAL_CELL.match(cell):
                out.append(f"{name}:{_line(text, row.start())}: a goal marked {cell[:20]!r}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_docs_are_for_users(page: Path) -> None:
    assert diary(page) == []


# A command line's interpreter: ``python`` at a line's start, after a prompt, a pipe,
# ``&&``, a backtick or a parenthesis; not a fence's language (```` ```python ````).
BARE_PYTHON = re.compile(r"(?:^[ \t]*(?:\$[ \t]+)?|[|&;(`][ \t]*)python(?=[ \t]+\S)", re.M)


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_commands_shown_use_python3(page: Path) -> None:
    """``python3`` is on every Python install; ``python`` is not (Debian, Ubuntu)."""
    text = page.read_text()
    found = [f"{page.relative_to(REPO)}:{_line(text, m.start())}" for m in BARE_PYTHON.finditer(text)]
    assert found == [], "show commands as python3 -m ..."


def test_bare_python_is_found() -> None:
    shown = "    python -m x\n$ python -m y\nrun `python -m z`\n```python\nimport x\n```\npython3 -m ok\n"
    assert len(BARE_PYTHON.findall(shown)) == 3


def test_diary_check_finds_a_diary(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text(
        "# Goals\n\nDone in this stop (issue 39, session 4).\n\nThat evening it gave 1.02x.\n\n"
        "| goal | result |\n|---|---|\n| fast | **met**: 2x |\n| small | missed |\n\n"
        "A session of an agent, `#0`, https://github.com/o/r/issues/12 and what was missed are fine.\n"
    )
    found = diary(page, tmp_path)
    assert [f.split(": ", 1)[1].split(":")[0] for f in found] == [
        "an issue number",
        "a session number",
        "a work session",
        "a goal heading",
        "a time of day",
        "a goal table",
        "a goal marked '**met**",
        "a goal marked 'missed'",
    ]
