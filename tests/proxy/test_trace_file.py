"""proxy.cli.trace.Trace: a trace read one line at a time, the same lines as read whole."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from proxy.cli.trace import Trace, TraceError, read_trace

GOOD = json.dumps(
    {"t": 1, "headers": {}, "body": {"model": "m", "messages": [{"role": "user", "content": "a\u2028b"}]}}
)


def _lines(trace: Trace) -> list[tuple[int, str]]:
    return [(line.line, line.body["messages"][0]["content"]) for line in trace]


def test_lines_come_one_at_a_time_numbered_as_editors_count(tmp_path: Path) -> None:
    """Counted on opening (a progress bar's total), read as they are asked for:
    blank lines, CRLF, a raw U+2028, a line that is not UTF-8 or not JSON, and no
    final newline, each as the whole-file reading had them."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join([GOOD.encode(), b"", GOOD.encode() + b"\r", b"\xff", b"{", GOOD.encode()]))
    errors = io.StringIO()
    trace = Trace(path, errors, "audit")
    assert trace.lines == 6 and trace.read == 0
    it = iter(trace)
    assert next(it).line == 1 and trace.read == 1  # nothing past the line asked for
    assert [line.line for line in it] == [3, 6]
    assert [s["line"] for s in trace.skipped] == [
        4,
        5,
    ] and "t.jsonl:4: skipped: not UTF-8 (index 3)" in errors.getvalue()
    again, skipped = read_trace(path, io.StringIO(), "audit")
    assert [line.line for line in again] == [1, 3, 6] and skipped == trace.skipped
    assert again[0].body["messages"][0]["content"] == "a\u2028b"


@pytest.mark.parametrize(("data", "lines"), [(b"", 0), (b"x", 1), (b"x\n", 1), (b"x\ny", 2), (b"\n\n", 2)])
def test_the_line_count_is_the_files(tmp_path: Path, data: bytes, lines: int) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert Trace(path, io.StringIO(), "audit").lines == lines


def test_a_file_that_cannot_be_read_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        Trace(tmp_path / "missing.jsonl", io.StringIO(), "audit")
    with pytest.raises(TraceError, match="cannot read trace"):
        Trace(tmp_path, io.StringIO(), "audit")  # a directory
