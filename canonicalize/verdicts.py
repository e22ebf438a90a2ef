"""The providers' own explanation of a cache result, in prefixpin's causes.

A provider asked to compare a request with an earlier one of the same
conversation says why the cache could not reuse its prefix; prefixpin compares
that with its own break cause (``prefixpin_cache_verdicts_total{agree}``).

- Anthropic (``diagnostics.previous_message_id`` on the request): the response's
  ``diagnostics.cache_miss_reason`` is null (no divergence) or an object whose
  ``type`` is ``model_changed``, ``system_changed``, ``tools_changed``,
  ``messages_changed``, ``previous_message_not_found`` or ``unavailable``.
- OpenAI Responses (``prompt_cache_options.comparison_response_id`` on the
  request): the response's ``prompt_cache_diagnostics`` has a ``type``:
  ``cache_hit`` (no mismatch), ``cache_miss`` (with a ``reason``: ``model_changed``,
  ``prompt_cache_key_changed``, ``service_tier_changed``, ``tools_changed``,
  ``text_format_changed``, ``reasoning_effort_changed``, ``verbosity_changed``,
  ``context_compacted``, ``input_changed``), ``comparison_response_not_found`` or
  ``unavailable``.

OpenAI's ``input_changed`` covers both the instructions and the earlier input, so
it agrees with prefixpin's ``system_changed`` and ``history_rewritten``; the
request settings OpenAI names (key, service tier, text format, reasoning effort,
verbosity) are prefixpin's ``params_changed``.  A provider that could not compare
(not found, unavailable, still running, a reason not listed here) gives no verdict.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

NO_BREAK = "none"  # the provider compared and found no divergence

_ANTHROPIC = {
    "model_changed": frozenset({"model_changed"}),
    "system_changed": frozenset({"system_changed"}),
    "tools_changed": frozenset({"tools_changed"}),
    "messages_changed": frozenset({"history_rewritten"}),
}
_PARAMS = frozenset({"params_changed"})
_OPENAI = {
    "model_changed": frozenset({"model_changed"}),
    "tools_changed": frozenset({"tools_changed"}),
    "input_changed": frozenset({"system_changed", "history_rewritten"}),
    "context_compacted": frozenset({"history_rewritten"}),
    "prompt_cache_key_changed": _PARAMS,
    "service_tier_changed": _PARAMS,
    "text_format_changed": _PARAMS,
    "reasoning_effort_changed": _PARAMS,
    "verbosity_changed": _PARAMS,
}


def provider_causes(diagnostics: Any) -> frozenset[str] | None:
    """The prefixpin causes (section 6's, or :data:`NO_BREAK`) a provider's
    diagnostics object agrees with; None when the provider gave no verdict."""
    if not isinstance(diagnostics, dict):
        return None
    if "cache_miss_reason" in diagnostics:  # Anthropic
        reason = diagnostics["cache_miss_reason"]
        if reason is None:
            return frozenset({NO_BREAK})
        kind = reason.get("type") if isinstance(reason, dict) else None
        return _ANTHROPIC.get(kind) if isinstance(kind, str) else None
    kind = diagnostics.get("type")  # OpenAI Responses
    if kind == "cache_hit":
        return frozenset({NO_BREAK})
    if kind == "cache_miss":
        reason = diagnostics.get("reason")
        return _OPENAI.get(reason) if isinstance(reason, str) else None
    return None


def agrees(ours: str | None, diagnostics: Any) -> bool | None:
    """Whether prefixpin's break cause ``ours`` (None: no break) is the provider's;
    None when the provider gave no verdict."""
    theirs = provider_causes(diagnostics)
    if theirs is None:
        return None
    return (ours or NO_BREAK) in theirs


__all__ = ["NO_BREAK", "agrees", "provider_causes"]
