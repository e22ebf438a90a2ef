"""The CI gate of ``prefixpin audit``: ``--fail-on CAUSE[,CAUSE...]`` and ``--min-ratio X``.

A gate judges the trace *after* canonicalization (what prefixpin would forward):
``--fail-on`` fails when any request still breaks its parent's prefix for one of
the named causes (``any`` names all five), ``--min-ratio`` when the trace's total
predicted cacheable share of prompt bytes is below ``X``.  A failed gate exits
:data:`FAILED` (3); a gate that cannot be read exits 2, like every other usage
error; 0 is a pass.  What failed is said on stderr, one line per request (its
index, ``#7``: its line in the trace from 0, as in the text report, ``--json`` and
``--html``; its lineage, cause and changed field, never the prompt text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from canonicalize.predict import CAUSES

FAILED = 3
SHOWN = 20  # failing requests named on stderr; the rest are counted


class GateError(ValueError):
    """A gate argument that cannot be read (exit 2)."""


@dataclass(frozen=True, slots=True)
class Gate:
    fail_on: frozenset[str] = frozenset()
    min_ratio: float | None = None

    @classmethod
    def parse(cls, fail_on: str | None, min_ratio: float | None) -> Gate:
        causes: set[str] = set()
        for name in (fail_on or "").split(","):
            name = name.strip()
            if not name:
                continue
            if name == "any":
                causes.update(CAUSES)
            elif name in CAUSES:
                causes.add(name)
            else:
                raise GateError(f"--fail-on: unknown cause {name!r} (one of: any, {', '.join(CAUSES)})")
        if fail_on is not None and not causes:
            raise GateError("--fail-on: name at least one cause")
        if min_ratio is not None and not 0.0 <= min_ratio <= 1.0:
            raise GateError(f"--min-ratio: {min_ratio} is not between 0 and 1")
        return cls(frozenset(causes), min_ratio)

    @property
    def active(self) -> bool:
        return bool(self.fail_on) or self.min_ratio is not None

    def failures(self, report: dict[str, Any]) -> list[str]:
        """Why ``report`` (``audit``'s) fails the gate; empty: it passes."""
        out: list[str] = []
        if self.fail_on:
            broken = [r for r in report["requests"] if r["cause"] in self.fail_on]
            out += [_request(r) for r in broken[:SHOWN]]
            if len(broken) > SHOWN:
                out.append(f"... and {len(broken) - SHOWN} more requests with {', '.join(sorted(self.fail_on))}")
        if self.min_ratio is not None:
            total = report["total"]
            ratio = total["cacheable_bytes_after"] / total["prompt_bytes"] if total["prompt_bytes"] else None
            if ratio is None:
                out.append("--min-ratio: the trace has no request to judge")
            elif ratio < self.min_ratio:
                out.append(f"predicted cacheable ratio {ratio:.4f} after canonicalization is below {self.min_ratio}")
        return out


def _request(r: dict[str, Any]) -> str:
    ev = r.get("evidence") or {}
    where = f" in {ev['field']} at byte {ev['offset']}" if ev else ""
    parent = f" against #{r['parent']}" if r.get("parent") is not None else ""
    return f"request #{r['index']} ({r['lineage']}, {r['role']}): {r['cause']}{where}{parent}"


def report_failures(failures: Sequence[str]) -> str:
    return "".join(f"prefixpin audit: gate failed: {line}\n" for line in failures)
