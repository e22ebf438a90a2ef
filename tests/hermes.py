"""Hermes-agent request material for tests, shaped like seeds 000/001/003.

The parent's system prompt and its legacy (pre-fix) background-review fork differ
exactly as in issue #25322: a skills line the narrow toolset hides, the
``Conversation started`` minute, and a fresh ``Session ID``.
"""

from __future__ import annotations

import copy
from typing import Any

SEP = "═" * 46

SKILLS_FULL = [
    "    - linear: Linear: manage issues, projects, teams via GraphQL + curl.",
    "    - maps: Geocode, POIs, routes, timezones via OpenStreetMap/OSRM.",
    "    - nano-pdf: Edit PDF text/typos/titles via nano-pdf CLI (NL prompts).",
]
SKILLS_REVIEW = [SKILLS_FULL[0], SKILLS_FULL[2]]

REVIEW_PROMPT = (
    "Review the conversation above and consider saving to memory if appropriate.\n\n"
    "Focus on:\n1. Has the user revealed things about themselves?\n\n"
    "If something stands out, save it using the memory tool. "
    "If nothing is worth saving, just say 'Nothing to save.' and stop.\n\n"
    "You can only call memory and skill management tools. Other tools will be denied "
    "at runtime — do not attempt them."
)


def system_prompt(
    *,
    minute: str = "02:30 PM",
    session: str = "20260513_204511_d02a5d",
    pct: int = 49,
    chars: str = "1,085",
    skills: list[str] | None = None,
    extra: str = "",
    filler: int = 40,
) -> str:
    skills = SKILLS_FULL if skills is None else skills
    guidance = " ".join(f"Guideline {i}: keep answers short and cite files precisely." for i in range(filler))
    return "\n".join(
        [
            "You are Hermes Agent, an intelligent AI assistant created by Nous Research.",
            guidance,
            extra,
            "## Skills (mandatory)",
            "<available_skills>",
            "  productivity:",
            *skills,
            "</available_skills>",
            "",
            SEP,
            f"MEMORY (your personal notes) [{pct}% — {chars}/2,200 chars]",
            SEP,
            "User prefers ruff.\n§\nProject uses pytest.",
            "",
            SEP,
            "USER PROFILE (who the user is) [12% — 170/1,375 chars]",
            SEP,
            "Name: Alice.",
            "",
            f"Conversation started: Thursday, May 14, 2026 {minute}",
            f"Session ID: {session}",
            "Model: anthropic/claude-opus-4.6",
            "Provider: openrouter",
        ]
    )


def _tool(tool_name: str, desc: str, **props: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool_name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
                "required": list(props)[:1],
            },
        },
    }


TOOLS_FULL = [
    _tool("terminal", "Run a shell command.", command="The command to run", workdir="Working directory"),
    _tool("read_file", "Read a file.", path="File path"),
    _tool("web_search", "Search the web.", query="Search query"),
    _tool("memory", "Save or update durable memory.", action="add|replace|remove", content="Entry text"),
    _tool("skill_manage", "Create or patch a skill.", action="create|patch|write_file", name="Skill name"),
    _tool("skill_view", "Read a skill.", name="Skill name"),
    _tool("skills_list", "List skills.", category="Category filter"),
    _tool("session_search", "Search past sessions.", query="Search query"),
]
REVIEW_TOOL_NAMES = ("memory", "skill_manage", "skill_view", "skills_list")
TOOLS_REVIEW = [t for t in TOOLS_FULL if t["function"]["name"] in REVIEW_TOOL_NAMES]


def tools_full() -> list[dict[str, Any]]:
    return copy.deepcopy(TOOLS_FULL)


def tools_review() -> list[dict[str, Any]]:
    return copy.deepcopy(TOOLS_REVIEW)


def request(
    system: str, history: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "system", "content": system}, *history]}
    if tools is not None:
        body["tools"] = tools
    body.update(extra)
    return body
