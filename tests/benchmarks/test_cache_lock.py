"""What the tests and benchmarks build into the shared cache is built by one run at a time."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from tests.infra import llama


def test_the_cache_lock_is_held_until_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama, "CACHE", tmp_path / "sub")
    lock = llama.cache_lock("venv")
    with open(tmp_path / "sub" / ".venv.lock") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open of the file (another run) is kept out
    lock.close()
    with open(tmp_path / "sub" / ".venv.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
