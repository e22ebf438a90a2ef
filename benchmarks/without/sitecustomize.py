"""Loaded by the interpreter of a ``prefixpin serve`` that ``benchmarks.bench_paired
--without`` starts (this directory first on its PYTHONPATH), and only there: replaces
named functions with ones that do nothing and return a given value, as their modules
are imported, so the pair measures what a part of the request's life costs live.

``PREFIXPIN_WITHOUT`` holds a JSON list of ``[module, qualified name, value]`` (a
method is ``Class.method``; the replacement of an ``async def`` is one too).  Once
every one is replaced, their list is written to the file ``PREFIXPIN_WITHOUT_DONE``
names; a name that is not there is written as ``!module:name``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
from types import ModuleType
from typing import Any

_SPEC = os.environ.get("PREFIXPIN_WITHOUT")


def _nothing(original: Any, value: Any) -> Any:
    if inspect.iscoroutinefunction(original):

        async def nothing_async(*args: Any, **kwargs: Any) -> Any:
            return value

        return nothing_async

    def nothing(*args: Any, **kwargs: Any) -> Any:
        return value

    return nothing


class _Without(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the named modules as the path finder does, and replaces the names once
    each has run."""

    def __init__(self, wanted: list[tuple[str, str, Any]]) -> None:
        self.pending = {module: [(name, value) for m, name, value in wanted if m == module] for module, _, _ in wanted}
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
        for name, value in self.pending.pop(module.__name__, []):
            *path, last = name.split(".")
            owner: Any = module
            try:
                for part in path:
                    owner = getattr(owner, part)
                setattr(owner, last, _nothing(getattr(owner, last), value))
                self.done.append(f"{module.__name__}:{name}")
            except AttributeError:
                self.done.append(f"!{module.__name__}:{name}")
        if not self.pending:
            with open(os.environ["PREFIXPIN_WITHOUT_DONE"], "w", encoding="utf-8") as out:
                out.write("\n".join(self.done) + "\n")


if _SPEC:
    sys.meta_path.insert(0, _Without([(m, n, v) for m, n, v in json.loads(_SPEC)]))
