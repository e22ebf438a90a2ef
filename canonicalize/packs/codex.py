"""openai/codex.

Its volatile items (environment_context, subagent roster) live in user-role
messages, which replay unchanged.  What breaks a fork's cache is the request's
``prompt_cache_key`` (a fresh thread id per fork/side-chat): a fork inherits its
parent's.
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack

PACK = Pack(name="codex", rules=(), inherit_params=("prompt_cache_key",))
