"""``bench_mypyc --live``'s two trees: the same ``proxy/``, the core as sources in one
and the compiled copy (with its shared runtime library at the top) in the other.  A
stand-in build: no compiler runs here."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from benchmarks import bench_mypyc, mypyc_build


def test_live_trees(tmp_path: Path) -> None:
    build = tmp_path / "build"
    (build / "canonicalize").mkdir(parents=True)
    (build / "canonicalize" / f"pins{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF")
    (build / f"abc__mypyc{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF")
    (build / "build.json").write_text("{}")

    trees = bench_mypyc.live_trees(build, tmp_path / "work")

    assert set(trees) == {"pure", "compiled"}
    for tree in trees.values():
        assert (tree / "proxy" / "cli" / "__main__.py").is_file()
        assert not list(tree.rglob("__pycache__"))
    pure, compiled = trees["pure"], trees["compiled"]
    assert (pure / "canonicalize" / "pins.py").read_bytes() == (mypyc_build.SOURCE / "pins.py").read_bytes()
    assert not list(pure.rglob(f"*{EXTENSION_SUFFIXES[0]}"))
    assert (compiled / "canonicalize" / f"pins{EXTENSION_SUFFIXES[0]}").is_file()
    assert (compiled / f"abc__mypyc{EXTENSION_SUFFIXES[0]}").is_file()
    assert not (compiled / "build.json").exists()


def test_live_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = bench_mypyc.parse(["--live", "--runs", "3", "--slices", "20"])
    assert (args.live, args.runs, args.slices) == (True, 3, 20)
    for bad in (["--live", "--json"], ["--live", "--evict", "8"], ["--live", "--runs", "0"]):
        with pytest.raises(SystemExit):
            bench_mypyc.parse(bad)
    assert "--runs and --slices: at least 1" in capsys.readouterr().err
