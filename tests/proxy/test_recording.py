"""proxy.recording: a request as one trace line (credentials removed, the body as the
client sent it), the file several processes append to and rotate, the bounded queue
and its writer thread.  Real files throughout; ``/dev/full`` and ``RLIMIT_FSIZE`` for
a full disk."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from canonicalize import Usage
from proxy.cli.trace import parse_line
from proxy.recording import AppendError, Encoder, Entry, Recorder, TraceFile
from proxy.recording.line import CHECK_MAX_BYTES, MAX_NAMES
from tests.infra.wait import wait_until

BODY = b'{"model":"m","messages":[{"role":"user","content":"caf\\u00e9 \xe2\x80\xa8 ok"}],"temperature":0.50,"n":1e0}'


def entry(body: bytes = BODY, *, parsed: bool = True, **kw: Any) -> Entry:
    fields: dict[str, Any] = {
        "t": 1764201234.5171,
        "path": "/v1/chat/completions",
        "query": b"",
        "headers": [(b"content-type", b"application/json")],
        "body": body,
        "parsed": parsed,
        "flat": False,
        "tenant": "k0123",
        "lineage": "abc",
        "role": "continuation",
        "status": 200,
        "usage": Usage(2000, 1500, 10),
        "completion": 7,
        "response": {"role": "assistant", "content": "done"},
    }
    return Entry(**{**fields, **kw})


def line_of(e: Entry, encoder: Encoder | None = None) -> bytes:
    return b"".join((encoder or Encoder()).encode(e))


# -- the line ----------------------------------------------------------------------------


def test_a_line_is_what_audit_reads_and_its_body_the_clients_bytes() -> None:
    line = line_of(entry())
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert obj["t"] == 1764201234.517 and obj["path"] == "/v1/chat/completions"
    assert (obj["tenant"], obj["lineage"], obj["role"], obj["status"]) == ("k0123", "abc", "continuation", 200)
    assert obj["usage"] == {
        "prompt_tokens": 2000,
        "cached_tokens": 1500,
        "cache_write_tokens": 10,
        "completion_tokens": 7,
    }
    assert obj["response"] == {"role": "assistant", "content": "done"}
    assert line[line.index(b',"body":') + 8 : -2] == BODY  # every byte: 0.50, 1e0, the escape, U+2028 raw
    parsed = parse_line(1, line.decode())
    assert parsed.raw == BODY and parsed.body == json.loads(BODY) and parsed.recorded


def test_newlines_between_tokens_become_spaces_in_place() -> None:
    body = b'{\r\n  "model": "m",\n  "messages": [{"role": "user", "content": "two\\nlines"}]\n}\n'
    line = line_of(entry(body))
    assert line.count(b"\n") == 1
    parsed = parse_line(1, line.decode())
    assert parsed.raw == body.replace(b"\r", b" ").replace(b"\n", b" ")  # same length, same offsets
    assert parsed.body == json.loads(body) and parsed.body["messages"][0]["content"] == "two\nlines"


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"a": NaN}', b'{"a": "\xff"}', b'{"a":1} {"b":2}', b"\xef\xbb\xbf{}", b'"\xed\xa0\x80"', b"[1]"],
)
def test_a_body_that_is_not_json_text_is_kept_in_base64(body: bytes) -> None:
    obj = json.loads(line_of(entry(body, parsed=False)))
    if body == b"[1]":  # JSON text, not an object: embedded, and the audit says what it is
        assert obj["body"] == [1]
        with pytest.raises(ValueError, match="not an object"):
            parse_line(1, json.dumps(obj))
        return
    assert obj["body"] is None
    if body == b'{"a": NaN}':  # the audit reads it as Python's json does
        assert parse_line(1, json.dumps(obj)).raw == body
        return
    with pytest.raises(ValueError, match="body_base64"):
        parse_line(1, json.dumps(obj))


def test_json_the_proxy_did_not_parse_is_checked_and_embedded() -> None:
    lone = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'  # JSON; orjson refuses it
    assert parse_line(1, line_of(entry(lone, parsed=False)).decode()).raw == lone


def test_a_big_body_the_proxy_did_not_parse_goes_in_base64_and_audit_reads_it() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * CHECK_MAX_BYTES}]}).encode()
    obj = json.loads(line_of(entry(body, parsed=False)))
    assert obj["body"] is None and len(obj["body_base64"]) > CHECK_MAX_BYTES
    parsed = parse_line(1, json.dumps(obj))
    assert parsed.raw == body and parsed.body["model"] == "m"


@pytest.mark.parametrize(
    "name",
    [
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "cookie",
        "Authorization",
        "x-my-credential",  # configured in tenancy.credential_headers
        "x-auth-token",  # named like a credential
        "openai-secret",
    ],
)
def test_no_credential_header_reaches_the_line(name: str) -> None:
    headers = [(name.lower().encode(), b"sk-SECRET-1"), (b"x-session-id", b"s1"), (b"anthropic-version", b"2023")]
    line = line_of(entry(headers=headers), Encoder(headers=("x-my-credential",)))
    assert b"SECRET" not in line
    assert json.loads(line)["headers"] == {"x-session-id": "s1", "anthropic-version": "2023"}


@pytest.mark.parametrize("key", ["key", "api_key", "api-key", "access_token", "token", "sig", "Api%5FKey", "my_param"])
def test_no_credential_query_key_reaches_the_line(key: str) -> None:
    query = f"api-version=2024-10-21&{key}=SECRET&x=1".encode()
    obj = json.loads(line_of(entry(query=query), Encoder(params=("my_param",))))
    assert "SECRET" not in json.dumps(obj)
    assert obj["path"] == "/v1/chat/completions?api-version=2024-10-21&x=1"
    only = json.loads(line_of(entry(query=f"{key}=SECRET".encode()), Encoder(params=("my_param",))))
    assert only["path"] == "/v1/chat/completions"


def test_a_reply_orjson_cannot_write_leaves_the_line_without_it() -> None:
    obj = json.loads(line_of(entry(response={"role": "assistant", "content": "x", "n": 2**70})))
    assert obj["response"] is None and obj["role"] == "continuation"


def test_header_names_are_remembered_up_to_a_bound_and_credentials_still_removed() -> None:
    encoder = Encoder(headers=("x-my-credential",))
    many = [(b"x-h%d" % i, b"v") for i in range(MAX_NAMES + 50)]
    for _ in range(2):  # the second time from what it remembers
        obj = json.loads(line_of(entry(headers=[*many, (b"authorization", b"sk-SECRET")]), encoder))
        assert len(obj["headers"]) == MAX_NAMES + 50 and "authorization" not in obj["headers"]
    assert len(encoder._names) == MAX_NAMES  # full: the names past it are judged each time
    late = json.loads(line_of(entry(headers=[(b"x-my-credential", b"SECRET"), (b"X-Later", b"1")]), encoder))
    assert late["headers"] == {"x-later": "1"}


# -- the file ----------------------------------------------------------------------------


def lines_in(path: Path) -> list[bytes]:
    return [ln for ln in path.read_bytes().split(b"\n") if ln] if path.exists() else []


def test_rotation_keeps_keep_files_each_under_max_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    f = TraceFile(path, max_bytes=1000, keep=2)
    for i in range(30):
        f.append([[b'{"n":%d,"pad":"' % i, b"x" * 90, b'"}\n']])
    f.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.jsonl.1", "t.jsonl.2"]
    kept = [
        json.loads(ln)["n"]
        for p in (path.with_suffix(".jsonl.2"), path.with_suffix(".jsonl.1"), path)
        for ln in lines_in(p)
    ]
    assert kept == list(range(30 - len(kept), 30))  # the newest, in order
    assert all(p.stat().st_size <= 1000 for p in tmp_path.iterdir())
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_keep_zero_removes_the_full_file_and_a_long_line_stands_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    f = TraceFile(path, max_bytes=100, keep=0)
    f.append([[b'{"a":1}\n'], [b'{"long":"' + b"y" * 300 + b'"}\n'], [b'{"b":2}\n']])
    assert lines_in(path) == [b'{"b":2}'] and list(tmp_path.iterdir()) == [path]


def test_a_line_a_killed_writer_left_open_is_ended(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"whole":1}\n{"cut": "in the midd')
    TraceFile(path, 1 << 20, 1).append([[b'{"next":2}\n']])
    assert lines_in(path) == [b'{"whole":1}', b'{"cut": "in the midd', b'{"next":2}']


def test_short_writes_go_on_where_they_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write may take fewer bytes than it was given (a signal, a pipe): the next one
    goes on from there, also across more pieces than one writev takes."""
    calls = []

    def short(fd: int, pieces: list[Any]) -> int:
        calls.append(len(pieces))
        return os.write(fd, b"".join(bytes(p) for p in pieces)[:7])

    monkeypatch.setattr("proxy.recording.file.os.writev", short)
    path = tmp_path / "t.jsonl"
    lines = [[b'{"n":', b"%d" % i, b',"p":"' + b"x" * (i % 13), b'"}\n'] for i in range(400)]  # 1,600 pieces
    TraceFile(path, 1 << 30, 1).append(lines)
    whole = b"".join(b"".join(line) for line in lines)
    assert path.read_bytes() == whole
    assert max(calls) == 1024 and len(calls) == -(-len(whole) // 7)


def test_dev_full_raises_and_writes_nothing(tmp_path: Path) -> None:
    f = TraceFile("/dev/full", 10, 1)
    with pytest.raises(AppendError) as exc:
        f.append([[b"{}\n"]])
    assert exc.value.written == 0 and "No space left" in str(exc.value)


FSIZE_SCRIPT = """
import resource, signal, sys
from proxy.recording import AppendError, TraceFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (150, 150))  # the disk is full at 150 bytes
f = TraceFile(sys.argv[1], 1 << 20, 1)
f.append([[b'{"first":"' + b"a" * 80 + b'"}\\n']])
try:
    f.append([[b'{"second":"' + b"b" * 80 + b'"}\\n']])
except AppendError as exc:
    print("lost", exc.written, exc.errno)
"""


def test_a_write_cut_short_by_a_full_disk_leaves_no_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    out = subprocess.run([sys.executable, "-c", FSIZE_SCRIPT, str(path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "lost 0 27", out.stderr  # EFBIG, after a partial write
    assert path.read_bytes() == b'{"first":"' + b"a" * 80 + b'"}\n'


def _append_many(path: str, seed: int, n: int) -> None:
    rng = random.Random(seed)
    f = TraceFile(path, max_bytes=256 * 1024, keep=10_000)
    for i in range(n):
        size = rng.choice((10, 1000, 70_000, 150_000))  # many past PIPE_BUF and a pipe's 64 KiB
        f.append([[b'{"w":%d,"i":%d,"p":"' % (seed, i), bytes([97 + seed]) * size, b'"}\n']])
    f.close()


def test_processes_appending_at_once_keep_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), seed, 40)) for seed in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    seen: dict[int, list[int]] = {}
    files = list(tmp_path.iterdir())
    assert len(files) > 10, "rotated by several processes"
    for f in files:
        assert f.stat().st_size <= 256 * 1024 or len(lines_in(f)) == 1
        for line in lines_in(f):
            obj = json.loads(line)
            assert set(obj["p"]) == {chr(97 + obj["w"])}
            seen.setdefault(obj["w"], []).append(obj["i"])
    assert {w: sorted(i) for w, i in seen.items()} == {w: list(range(40)) for w in range(4)}


# -- the queue and the thread ------------------------------------------------------------


class Gate(TraceFile):
    """A real file whose appends wait until the test opens the gate."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, 1 << 30, 1)
        self.open_gate = threading.Event()

    def append(self, lines: Any) -> None:
        self.open_gate.wait(30)
        super().append(lines)


def recorder(file: TraceFile, **bounds: int) -> tuple[Recorder, list[int]]:
    lost: list[int] = []
    r = Recorder(file, Encoder(), lost.append, **bounds)
    r.start()
    return r, lost


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "t.jsonl")
    r, lost = recorder(gate, max_lines=3)
    assert r.put(entry())  # the thread takes it and waits at the gate
    wait_until(lambda: not r._queue, message="the writer holds the first entry")
    assert all(r.put(entry()) for _ in range(3))
    assert not r.put(entry()) and not r.put(entry())
    assert lost == [1, 1]
    gate.open_gate.set()
    assert r.flush(10)
    r.close()
    assert len(lines_in(tmp_path / "t.jsonl")) == 4


def test_the_queue_is_bounded_in_bytes_too(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "t.jsonl")
    r, lost = recorder(gate, max_bytes=3 * (len(BODY) + 1024))
    r.put(entry())
    wait_until(lambda: not r._queue, message="the writer holds the first entry")
    assert [r.put(entry()) for _ in range(4)] == [True, True, True, False]
    gate.open_gate.set()
    r.close()
    assert lost == [1]


def test_close_writes_what_is_queued(tmp_path: Path) -> None:
    r, lost = recorder(TraceFile(tmp_path / "t.jsonl", 1 << 20, 1))
    for i in range(100):
        r.put(entry(lineage=str(i)))
    r.close()
    assert [json.loads(ln)["lineage"] for ln in lines_in(tmp_path / "t.jsonl")] == [str(i) for i in range(100)]
    assert not lost and not r.put(entry())


def test_failed_writes_are_counted_and_warned_of_now_and_then(caplog: pytest.LogCaptureFixture) -> None:
    r, lost = recorder(TraceFile("/dev/full", 1 << 20, 1))
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        for _ in range(3):
            r.put(entry())
            assert r.flush(10)
    r.close()
    assert sum(lost) == 3
    warnings = [rec for rec in caplog.records if "not recorded" in rec.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()


def test_a_path_that_cannot_be_opened_is_counted(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    r, lost = recorder(TraceFile(tmp_path / "dir", 1 << 20, 1))  # a directory: open fails
    r.put(entry())
    assert r.flush(10)
    r.close()
    assert lost == [1]


def test_the_file_is_opened_again_when_it_was_moved_away(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    f = TraceFile(path, 1 << 20, 1)
    f.append([[b'{"a":1}\n']])
    os.rename(path, tmp_path / "moved.jsonl")  # logrotate, or another worker
    f.append([[b'{"b":2}\n']])
    assert lines_in(path) == [b'{"b":2}'] and lines_in(tmp_path / "moved.jsonl") == [b'{"a":1}']
