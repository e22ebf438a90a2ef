"""openai/codex.

Codex speaks only the Responses API (``POST /v1/responses``, streamed).  Its
volatile items (environment_context, subagent roster, the ``<current_date>``
block appended on a day change) live in input items after the first history
item, which replay unchanged: nothing of its append-only history is rewritten.

Its session identity is ``prompt_cache_key`` (the thread id) and the
``session-id`` / ``session_id`` header: two threads that share instructions and a
first message are two sessions.  What breaks a fork's cache is the request's
``prompt_cache_key`` (a fresh thread id per fork/side-chat): a fork inherits its
parent's.
"""

from __future__ import annotations

from canonicalize.packs._pack import Pack

PACK = Pack(
    name="codex",
    rules=(),
    inherit_params=("prompt_cache_key",),
    identity_params=("prompt_cache_key",),
    identity_headers=("session-id", "session_id"),
)
