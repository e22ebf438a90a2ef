"""What compiling the core (``canonicalize/``) with mypyc gives per request, on its own.

    python3 -m benchmarks.bench_mypyc            # 2048 requests per workload, 3 rounds (~15 s once compiled)
    python3 -m benchmarks.bench_mypyc --smoke    # a few requests, one round: proves it works
    python3 -m benchmarks.bench_mypyc --json     # the same as JSON
    python3 -m benchmarks.bench_mypyc --tests    # also the memo/no-memo tests against the compiled copy
    python3 -m benchmarks.bench_mypyc --evict 8  # with 8 MiB written between requests: cold caches
    python3 -m benchmarks.bench_mypyc --live     # two live prefixpin serve processes, paired slices (~5 min)

The core is compiled in a copy (:mod:`benchmarks.mypyc_build`: every module that
compiles and imports, the rest left pure; cached under ``~/.cache/prefixpin/mypyc``,
so only the first run pays the compile).  Then each round runs two subprocesses, one
with a plain copy of ``canonicalize/`` first on ``sys.path`` and one with the compiled
copy, each checking where every module of the core came from; both send
``bench_inprocess``'s workloads (body, conversation mix) through its request path
(the core, the splice and the record on an embedded store) and time them by CPU time.
Only the core differs between the two: ``proxy/`` and the libraries are the same
Python in both.  The table gives the median µs per request over the rounds and the
ratio pure / compiled; a ratio above 1 means the compiled core is faster.
``--evict N`` writes N MiB of other memory between requests, as
``bench_inprocess --evict`` does: the cost of a request whose code and kept objects
other work pushed out of the caches, as a live server's requests find them.

``--live`` measures the live server instead: two ``prefixpin serve`` processes of
this checkout, one with the compiled core in place of ``canonicalize/``, in front of
one instant upstream, taking turns in one-second ``wrk -c16`` slices
(:mod:`benchmarks.bench_paired`: its table, per workload, ``--runs`` times with
fresh processes).  Before the slices, each workload's first requests go through
both one at a time and must get the same roles; and a process started where each
runs imports the build's compiled modules there, none in the other.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import pkgutil
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

from benchmarks import bench_inprocess, bench_paired, mypyc_build
from benchmarks.mypyc_build import REPO
from benchmarks.overhead import nginx, roles, workloads
from benchmarks.overhead.targets import prefixpin
from benchmarks.overhead.tools import BIN_DIR

TESTS = ("tests/canonicalize/test_memo.py",)  # the memo/no-memo property tests
VARIANTS = ("pure", "compiled")
SMOKE = ["--requests", "64", "--conversations", "8", "--turns", "3"]


def core_modules(root: Path) -> list[str]:
    """Import every module of the core and check each came from ``root``; the compiled ones."""
    import canonicalize

    for info in pkgutil.walk_packages(canonicalize.__path__, "canonicalize."):
        importlib.import_module(info.name)
    compiled = []
    for name, module in sorted(sys.modules.items()):
        if name == "canonicalize" or name.startswith("canonicalize."):
            where = Path(module.__file__ or "").resolve()
            if not where.is_relative_to(root.resolve()):
                raise SystemExit(f"{name} was imported from {where}, not from {root}")
            if where.name.endswith(tuple(EXTENSION_SUFFIXES)):
                compiled.append(name)
    return compiled


def child(root: Path, requests: int, conversations: int, turns: int, evict: float = 0) -> int:
    """One subprocess's run (``--child``): the workloads through the core found in ``root``
    (``evict``: MiB written between requests)."""
    compiled = core_modules(root)
    out: dict[str, Any] = {"compiled": compiled, "canonicalize": sys.modules["canonicalize"].__file__, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="prefixpin-mypyc-") as tmp:
        for name, w in bench_inprocess.loads(Path(tmp), conversations, turns).items():
            us, roles = asyncio.run(bench_inprocess.run(w, requests, evict_mib=evict or None))
            out["workloads"][name] = {"us": us, "roles": dict(roles)}
    print(json.dumps(out))
    return 0


def child_tests(root: Path) -> int:
    """The memo/no-memo tests against the core found in ``root`` (``--child-tests``)."""
    import pytest

    compiled = core_modules(root)  # imported before pytest puts the repository on sys.path
    print(f"{len(compiled)} compiled modules of the core from {root}", flush=True)
    argv = [*(str(REPO / t) for t in TESTS), "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml")]
    # This module imported proxy/ and its libraries already: too late to rewrite their asserts.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    code = int(pytest.main(argv))
    if core_modules(root) != compiled:
        raise SystemExit("the tests ran against another copy of the core")
    return code


def spawn(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """This module in a subprocess with ``root`` first on ``sys.path`` (the repository after it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    cmd = [sys.executable, "-m", "benchmarks.bench_mypyc", *argv]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=3600)


def serves(root: Path) -> dict[str, str]:
    """The build's check: a few requests of each workload through the copy in ``root``, none
    failed open; else the module the first failure's traceback ended in."""
    done = spawn(root, ["--child", str(root), *SMOKE])
    if done.returncode != 0:
        return mypyc_build.blame(done.stderr, "fails to run the benchmark once compiled")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if any("fail-open" in w["roles"] for w in result["workloads"].values()):
        return mypyc_build.blame(done.stderr, "fails requests open once compiled")
    return {}


def measure(roots: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """``args.repeat`` rounds of both variants, alternating which goes first; every child's output."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    sizes = ["--requests", str(args.requests), "--conversations", str(args.conversations), "--turns", str(args.turns)]
    sizes += ["--evict", str(args.evict)]
    for r in range(args.repeat):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            done = spawn(roots[variant], ["--child", str(roots[variant]), *sizes])
            if done.returncode != 0:
                raise SystemExit(f"{variant} run failed:\n{done.stderr[-3000:]}")
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per workload: each variant's µs per request (every round and the median), the ratio, the roles."""
    out: dict[str, Any] = {}
    for name in runs["pure"][0]["workloads"]:
        row: dict[str, Any] = {}
        for v in VARIANTS:
            row[f"{v}_us"] = [round(run["workloads"][name]["us"], 1) for run in runs[v]]
            row[f"{v}_median_us"] = round(statistics.median(row[f"{v}_us"]), 1)
        row["ratio"] = round(row["pure_median_us"] / row["compiled_median_us"], 3)
        roles = {v: [run["workloads"][name]["roles"] for run in runs[v]] for v in VARIANTS}
        row["roles"] = roles["pure"][0]
        row["same_roles"] = all(r == roles["pure"][0] for v in VARIANTS for r in roles[v])
        out[name] = row
    return out


def check_variants(runs: dict[str, list[dict[str, Any]]], build: mypyc_build.Build) -> None:
    """The pure runs loaded no compiled module; the compiled runs loaded exactly the build's."""
    for run in runs["pure"]:
        if run["compiled"]:
            raise SystemExit(f"the pure run loaded compiled modules: {run['compiled']}")
    for run in runs["compiled"]:
        if sorted(run["compiled"]) != sorted(build.compiled):
            raise SystemExit(f"the compiled run loaded {run['compiled']}, the build has {build.compiled}")


def run_tests(build: mypyc_build.Build) -> dict[str, Any]:
    done = spawn(build.path, ["--child-tests", str(build.path)])
    lines = done.stdout.strip().splitlines()
    return {"tests": list(TESTS), "returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:]}


def commit() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True, cwd=REPO).stdout.strip() or "unknown"


def report(out: dict[str, Any]) -> None:
    """The markdown tables."""
    b = out["build"]
    compile_note = "cached" if b["cached"] else f"compiled in {b['compile_s']:.0f} s, {b['rounds']} rounds"
    print(f"mypyc {b['mypy']}: {len(b['compiled'])} of {len(b['compiled']) + len(b['excluded'])} modules ", end="")
    print(f"compiled ({compile_note}); commit {out['commit']}, {out['cpus']} CPUs, load {out['loadavg']}", end="")
    print(f"; {out['evict_mib']:g} MiB written between requests\n" if out["evict_mib"] else "\n")
    print("| workload | pure µs/request | compiled µs/request | pure / compiled | same roles |")
    print("|---|---:|---:|---:|---|")
    for name, row in out["workloads"].items():
        same = "yes" if row["same_roles"] else "NO"
        pure, comp = row["pure_median_us"], row["compiled_median_us"]
        print(f"| {name} | {pure:,.0f} | {comp:,.0f} | {row['ratio']:.2f}x | {same} |")
    if b["excluded"]:
        print("\nLeft pure (mypyc rejects them, or compiled they fail to import or to serve a request):\n")
        for name, why in b["excluded"].items():
            print(f"- `{name}`: {why}")
    if "tests" in out:
        t = out["tests"]
        print(f"\nMemo/no-memo tests against the compiled core ({', '.join(t['tests'])}): {t['summary']}")


def live_trees(build: Path, work: Path) -> dict[str, Path]:
    """Two runnable copies of this checkout's ``proxy/`` under ``work``: one with the core
    as sources, one with the compiled copy in ``build`` (its modules, and at its top the
    runtime library they share)."""
    skip = shutil.ignore_patterns("__pycache__")
    trees = {v: work / v for v in VARIANTS}
    for variant, tree in trees.items():
        shutil.copytree(REPO / "proxy", tree / "proxy", ignore=skip)
        core = mypyc_build.SOURCE if variant == "pure" else build / "canonicalize"
        shutil.copytree(core, tree / "canonicalize", ignore=skip)
    for lib in build.iterdir():
        if lib.is_file() and lib.name.endswith(tuple(EXTENSION_SUFFIXES)):
            shutil.copy2(lib, trees["compiled"])
    return trees


def loaded_core(tree: Path) -> list[str]:
    """The compiled modules of the core a process started in ``tree`` imports (a
    ``prefixpin serve`` there runs ``python -m proxy.cli`` with ``tree`` first on its path)."""
    done = spawn(tree, ["--child-core", str(tree)])
    if done.returncode != 0:
        raise SystemExit(f"the core in {tree} does not import:\n{done.stderr[-3000:]}")
    return sorted(json.loads(done.stdout.strip().splitlines()[-1]))


def live(build: mypyc_build.Build, args: argparse.Namespace) -> int:
    """``--live`` (module docstring): per workload, the pure core's process against the
    compiled one's, ``args.runs`` times; 1 when a check failed."""
    logs = BIN_DIR / "logs-mypyc-live"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefixpin-mypyc-live-") as tmp:
        work = Path(tmp)
        trees = live_trees(build.path, work)
        for variant, tree in trees.items():
            loaded = loaded_core(tree)
            if loaded != (sorted(build.compiled) if variant == "compiled" else []):
                print(f"{variant}: its core imports these compiled modules: {loaded}", file=sys.stderr)
                return 1
        up_proc, up = nginx.upstream(work, logs)
        try:
            for name in ("body", "mix"):
                load = workloads.named(work, name)
                lines = _live_workload(build, trees, up, load, logs, args)
                if lines is None:
                    return 1
                print("\n".join([*lines, ""]), flush=True)
        finally:
            up_proc.stop()
    return 0


def _live_workload(
    build: mypyc_build.Build,
    trees: dict[str, Path],
    upstream: str,
    load: workloads.Workload,
    logs: Path,
    args: argparse.Namespace,
) -> list[str] | None:
    """One workload's pairs (``bench_paired``'s report); None when a check failed."""
    count = 32 if load.name == "body" else 2 * workloads.MIX_CONVERSATIONS  # the mix: two turns of each

    def check(pair: tuple[bench_paired.Slices, bench_paired.Slices]) -> str | None:
        pure, compiled = (roles.sample(s.target.base or "", load, start=0, count=count) for s in pair)
        if pure != compiled:
            return f"{load.name}: the compiled core gave other roles: {dict(compiled)} (pure: {dict(pure)})"
        return None

    runs = []
    for _ in range(args.runs):
        pair = (
            bench_paired.Slices(prefixpin(upstream, name="prefixpin (pure core)", source=trees["pure"])),
            bench_paired.Slices(prefixpin(upstream, name="prefixpin (compiled core)", source=trees["compiled"])),
        )
        slices = 2 if args.smoke else args.slices
        if not bench_paired.one_run(pair, load, logs, slices, warm_s=1 if args.smoke else 3, check=check):
            return None
        runs.append(pair)
    return bench_paired.report(*runs[0], load.name) if len(runs) == 1 else bench_paired.summary(runs)


def _one_mib(text: str) -> float:
    """``--evict``'s value: one amount, as ``bench_inprocess --evict`` takes them."""
    sizes = bench_inprocess.mib_list(text)
    if len(sizes) != 1:
        raise argparse.ArgumentTypeError(f"one amount of MiB, got {text!r}")
    return sizes[0]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_mypyc", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2048, help="requests per workload (a quarter of them warm-up)")
    ap.add_argument("--conversations", type=int, default=64, help="mix: conversations in flight")
    ap.add_argument("--turns", type=int, default=8, help="mix: turns per conversation")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of both variants (the median is reported)")
    ap.add_argument("--smoke", action="store_true", help="64 requests, 8 conversations of 3 turns, one round")
    ap.add_argument("--tests", action="store_true", help="also run the memo/no-memo tests against the compiled core")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--evict", type=_one_mib, default=0, metavar="MIB", help="MiB written between requests")
    ap.add_argument("--live", action="store_true", help="two live prefixpin serve processes, paired slices")
    ap.add_argument("--slices", type=int, default=30, help="--live: one-second runs per process and workload")
    ap.add_argument("--runs", type=int, default=1, help="--live: times each pair is started afresh")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-tests", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-core", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.live and (args.json or args.tests or args.evict):
        ap.error("--live reports bench_paired's tables: it takes --runs, --slices and --smoke")
    if args.runs < 1 or args.slices < 1:
        ap.error("--runs and --slices: at least 1")
    if args.smoke:
        args.requests, args.conversations, args.turns, args.repeat = 64, 8, 3, 1  # SMOKE's sizes
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child(args.child, args.requests, args.conversations, args.turns, args.evict)
    if args.child_tests:
        return child_tests(args.child_tests)
    if args.child_core:
        print(json.dumps(core_modules(args.child_core)))
        return 0
    build, cached = mypyc_build.compiled_core(serves, log=True)
    if args.live:
        return live(build, args)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "cpus": os.cpu_count()}
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    out["evict_mib"] = args.evict
    out["build"] = {**{k: v for k, v in vars(build).items() if k != "path"}, "path": str(build.path), "cached": cached}
    with tempfile.TemporaryDirectory(prefix="prefixpin-mypyc-pure-") as tmp:
        shutil.copytree(mypyc_build.SOURCE, Path(tmp) / "canonicalize", ignore=shutil.ignore_patterns("__pycache__"))
        runs = measure({"pure": Path(tmp), "compiled": build.path}, args)
    check_variants(runs, build)
    out["workloads"] = summarize(runs)
    if args.tests:
        out["tests"] = run_tests(build)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        report(out)
    bad = [n for n, row in out["workloads"].items() if not row["same_roles"]]
    return 1 if bad or out.get("tests", {}).get("returncode", 0) != 0 else 0


if __name__ == "__main__":
    raise SystemExit(main())
