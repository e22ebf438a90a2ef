"""The sample outputs README.md and docs/ show are what their commands print now."""

from __future__ import annotations

from tests.infra import samples


def test_samples_match_their_commands() -> None:
    assert samples.drifted() == [], "sample output drifted: run ./scripts/samples (and commit what it rewrote)"
