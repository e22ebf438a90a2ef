"""What the benchmarks build into the shared cache is built by one run at a time."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from benchmarks.overhead.tools import exclusive


def test_exclusive_holds_the_lock_for_the_block_only(tmp_path: Path) -> None:
    lock = tmp_path / "sub" / "venv.lock"
    with exclusive(lock), open(lock) as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open of the file (another run) is kept out
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
