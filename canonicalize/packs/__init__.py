"""Built-in rule packs, one module per agent.

A pack is data: its rules (applied in order), fork markers (regexes on a fork's
last user message) and extra ``fork.inherit_params``.  Adding an agent touches one
module here and its test.
"""

from __future__ import annotations

from canonicalize.packs import claude_code, codex, generic, goose, hermes, openclaw, opencode
from canonicalize.packs._pack import Pack

PACKS: dict[str, Pack] = {
    p.name: p
    for p in (
        generic.PACK,
        hermes.PACK,
        claude_code.PACK,
        opencode.PACK,
        goose.PACK,
        openclaw.PACK,
        codex.PACK,
    )
}

__all__ = ["PACKS", "Pack"]
