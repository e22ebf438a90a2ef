"""Loaded by the interpreter of a ``prefixpin serve`` that ``benchmarks.bench_opcodes``
starts (this directory first on its PYTHONPATH), and only there: counts the bytecode
instructions each function executes, on the main thread (the event loop's).

SIGUSR1 starts the count; the next SIGUSR1 stops it and writes one line per function
(count, file, qualified name; tab-separated) to the file ``PREFIXPIN_OPCODES`` names.
"""

from __future__ import annotations

import os
import signal
import sys
from types import CodeType, FrameType
from typing import Any

_OUT = os.environ.get("PREFIXPIN_OPCODES")

if _OUT:
    counts: dict[CodeType, int] = {}

    def _local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            counts[code] = counts.get(code, 0) + 1
        return _local

    def _call(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return _local

    def _toggle(signum: int, frame: FrameType | None) -> None:
        if sys.gettrace() is None:
            counts.clear()
            sys.settrace(_call)
            return
        sys.settrace(None)
        with open(str(_OUT), "w", encoding="utf-8") as out:
            for code, n in sorted(counts.items(), key=lambda item: -item[1]):
                out.write(f"{n}\t{code.co_filename}\t{code.co_qualname}\n")

    signal.signal(signal.SIGUSR1, _toggle)
