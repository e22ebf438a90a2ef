"""Loaded by the interpreter of a ``prefixpin serve`` that ``benchmarks.bench_paired
--without`` or ``benchmarks.bench_parts`` starts (this directory first on its
PYTHONPATH), and only there: replaces named functions as their modules are imported.

- ``PREFIXPIN_WITHOUT`` (a JSON list of ``[module, qualified name, value]``): with
  ones that do nothing and return the value, so a pair measures what a part of the
  request's life costs live.
- ``PREFIXPIN_TIMED`` (a JSON list of ``[module, qualified name]``): with ones that
  count their calls and add up the CPU time of the calling thread each takes
  (``time.thread_time_ns``).  SIGUSR1 starts the count from zero; the next SIGUSR1
  writes ``{"module:name": [calls, nanoseconds]}`` to the file
  ``PREFIXPIN_TIMED_OUT`` names.

A method is ``Class.method``; the replacement of an ``async def`` is one too.  As
each module runs, the names replaced so far are written to the file
``PREFIXPIN_WITHOUT_DONE`` names; a name its module does not have as ``!module:name``
(a module never imported: not listed).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import json
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any

_SPEC = os.environ.get("PREFIXPIN_WITHOUT")
_TIMED = os.environ.get("PREFIXPIN_TIMED")
_SPENT: dict[str, list[int]] = {}  # "module:name" -> [calls, nanoseconds], while counting
_COUNTING = [False]


def _nothing(original: Any, value: Any) -> Any:
    if inspect.iscoroutinefunction(original):

        async def nothing_async(*args: Any, **kwargs: Any) -> Any:
            return value

        return nothing_async

    def nothing(*args: Any, **kwargs: Any) -> Any:
        return value

    return nothing


def _timed(original: Any, key: str) -> Any:
    clock = time.thread_time_ns

    def add(spent: int) -> None:
        if _COUNTING[0]:
            got = _SPENT.setdefault(key, [0, 0])
            got[0] += 1
            got[1] += spent

    if inspect.iscoroutinefunction(original):

        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return await original(*args, **kwargs)
            finally:
                add(clock() - t)

        return timed_async

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = clock()
        try:
            return original(*args, **kwargs)
        finally:
            add(clock() - t)

    return timed


def _toggle(signum: int, frame: Any) -> None:
    """SIGUSR1: start counting from zero, or stop and write the counts."""
    if not _COUNTING[0]:
        _SPENT.clear()
        _COUNTING[0] = True
        return
    _COUNTING[0] = False
    with open(os.environ["PREFIXPIN_TIMED_OUT"], "w", encoding="utf-8") as out:
        json.dump(_SPENT, out)


class _Without(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the named modules as the path finder does, and replaces the names once
    each has run (``make(original, "module:name")`` gives the replacement)."""

    def __init__(self, wanted: list[tuple[str, str]], make: Any) -> None:
        self.pending = {module: [name for m, name in wanted if m == module] for module, _ in wanted}
        self.make = make
        self.done: list[str] = []
        self._loaders: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            self._loaders[fullname], spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: Any) -> ModuleType | None:
        module: ModuleType | None = self._loaders[spec.name].create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loaders[module.__name__].exec_module(module)
        for name in self.pending.pop(module.__name__, []):
            *path, last = name.split(".")
            owner: Any = module
            key = f"{module.__name__}:{name}"
            try:
                for part in path:
                    owner = getattr(owner, part)
                setattr(owner, last, self.make(getattr(owner, last), key))
                self.done.append(key)
            except AttributeError:
                self.done.append(f"!{key}")
        with open(os.environ["PREFIXPIN_WITHOUT_DONE"], "w", encoding="utf-8") as out:  # so far
            out.write("\n".join(self.done) + "\n")


if _SPEC:
    _wanted = [(m, n, v) for m, n, v in json.loads(_SPEC)]
    _values = {f"{m}:{n}": v for m, n, v in _wanted}
    sys.meta_path.insert(
        0, _Without([(m, n) for m, n, _ in _wanted], lambda original, key: _nothing(original, _values[key]))
    )
elif _TIMED:
    sys.meta_path.insert(0, _Without([(m, n) for m, n in json.loads(_TIMED)], _timed))
    signal.signal(signal.SIGUSR1, _toggle)
