"""``prefixpin replay``: send a recorded trace upstream and report what the cache did.

A trace is JSON Lines, one request a line (SPEC section 3)::

    {"t": 1.5, "headers": {...}, "body": {<request>}, "path": "/v1/messages", "kind": "fork", "session": "s1"}

(see :mod:`proxy.cli.trace`).  ``kind`` and ``session`` are shown as columns and
totalled.  Requests go, in order and one at a time, to ``<via or upstream><path>``
(chat completions when the line names no path); through ``--via`` the running prefixpin
forwards them to its own upstream and tells us the role it gave each one
(``x-prefixpin-role``).

Streaming bodies always get ``stream_options.include_usage``: a direct upstream
only reports usage when asked, and prefixpin, which asks on the client's behalf,
removes that usage chunk again unless the client asked itself.  Usage is read
with :mod:`canonicalize.usage`, so every upstream's shape counts the same.

A request that got no response at all, or a 429 / 502 / 503 / 504, is tried again
(three tries in all, as the OpenAI SDKs do); the retried failures are listed in the
report.  A request that still fails (transport error, HTTP >= 400, an error event
in the stream) is reported and counted, the replay goes on, and the exit code is 1.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from canonicalize import SSESplitter, Usage, UsageAccumulator, parse_usage
from proxy.cli.progress import Progress
from proxy.cli.trace import Trace, TraceError, TraceLine, read_trace
from proxy.config import Tenancy

ATTEMPTS = 3  # the OpenAI SDKs' default: max_retries=2
RETRY_STATUS = frozenset({429, 502, 503, 504})
RETRY_BACKOFF_S = 0.25
# Headers a trace may carry that describe the recorded connection, not the request.
_CONNECTION_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "accept-encoding"})


@dataclass(slots=True)
class Result:
    """What one replayed request did."""

    line: int
    kind: str | None
    session: str | None
    status: int | None = None
    role: str | None = None
    replica: str | None = None  # x-prefixpin-replica: the upstream.pool replica that answered
    prompt: int | None = None
    cached: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    retried: list[str] = field(default_factory=list)  # failures that were tried again

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def processed(self) -> int | None:
        return None if self.prompt is None or self.cached is None else self.prompt - self.cached

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "processed": self.processed, "wall_s": round(self.wall_s, 4)}


@dataclass(slots=True)
class Totals:
    """Sums over a group of results (usage only from requests that reported it)."""

    requests: int = 0
    failed: int = 0
    retried: int = 0
    without_usage: int = 0
    prompt: int = 0
    cached: int = 0
    wall_s: float = 0.0

    def add(self, r: Result) -> None:
        self.requests += 1
        self.failed += not r.ok
        self.retried += len(r.retried)
        self.wall_s += r.wall_s
        if r.prompt is None or r.cached is None:
            self.without_usage += r.ok
        else:
            self.prompt += r.prompt
            self.cached += r.cached

    @property
    def processed(self) -> int:
        return self.prompt - self.cached

    @property
    def ratio(self) -> float | None:
        return self.cached / self.prompt if self.prompt else None

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "failed": self.failed,
            "retried": self.retried,
            "without_usage": self.without_usage,
            "prompt_tokens": self.prompt,
            "cached_tokens": self.cached,
            "processed_tokens": self.processed,
            "cached_ratio": None if self.ratio is None else round(self.ratio, 6),
            "wall_s": round(self.wall_s, 4),
        }


@dataclass(slots=True)
class Report:
    target: str
    upstream: str
    via: str | None
    results: list[Result] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def totals(self, key: str | None = None) -> dict[str, Totals]:
        """Totals over all results (``key=None``, under ``"all"``) or grouped by an attribute."""
        groups: dict[str, Totals] = {}
        for r in self.results:
            name = "all" if key is None else str(getattr(r, key) or "-")
            groups.setdefault(name, Totals()).add(r)
        return groups

    def to_json(self) -> dict[str, Any]:
        total = self.totals().get("all", Totals())
        return {
            "target": self.target,
            "upstream": self.upstream,
            "via": self.via,
            "requests": [r.to_json() for r in self.results],
            "total": total.to_json(),
            "by_kind": {k: t.to_json() for k, t in self.totals("kind").items()},
            "by_role": {k: t.to_json() for k, t in self.totals("role").items()},
            "skipped_lines": self.skipped,
        }


# -- sending ------------------------------------------------------------------------
_CREDENTIAL_HEADERS = frozenset(Tenancy().credential_headers)


def request_headers(line: TraceLine, api_key: str | None) -> dict[str, str]:
    headers = {k: v for k, v in line.headers.items() if k.lower() not in _CONNECTION_HEADERS}
    if api_key and not any(k.lower() in _CREDENTIAL_HEADERS for k in headers):
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _events(chunks: Iterable[bytes]) -> Iterator[Any]:
    """Parsed JSON ``data:`` payloads of an SSE byte stream (``[DONE]`` and junk skipped)."""
    splitter = SSESplitter()

    def parsed(events: Iterable[Any]) -> Iterator[Any]:
        for ev in events:
            if ev is None or ev.data is None or ev.data.strip() == b"[DONE]":
                continue
            try:
                yield json.loads(ev.data)
            except ValueError:
                continue

    for chunk in chunks:
        yield from parsed(splitter.feed(chunk))
    yield from parsed([splitter.flush()])


def _error_text(resp: httpx.Response, content: bytes) -> str:
    snippet = content[:300].decode("utf-8", "replace").strip()
    return f"HTTP {resp.status_code}: {snippet}" if snippet else f"HTTP {resp.status_code}"


def _attempt(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str], result: Result) -> bool:
    """One try: fills ``result``; True when a failure is worth another try."""
    result.status = result.role = result.replica = result.error = None
    result.prompt = result.cached = None
    usage: Usage | None = None
    try:
        with client.stream("POST", url, json=body, headers=headers) as resp:
            result.status = resp.status_code
            result.role = resp.headers.get("x-prefixpin-role")
            result.replica = resp.headers.get("x-prefixpin-replica")
            ctype = resp.headers.get("content-type", "")
            if resp.status_code >= 400:
                result.error = _error_text(resp, resp.read())
                return resp.status_code in RETRY_STATUS
            if "text/event-stream" in ctype:
                acc = UsageAccumulator()
                for event in _events(resp.iter_bytes()):
                    if isinstance(event, dict) and event.get("error") is not None:
                        result.error = f"error event in stream: {json.dumps(event['error'])[:300]}"
                    acc.feed(event)
                usage = acc.result
            else:
                content = resp.read()
                try:
                    usage = parse_usage(json.loads(content))
                except ValueError:
                    result.error = f"response is not JSON: {content[:120]!r}"
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        # Nothing came back: the request never started (a stale keep-alive connection,
        # a refused connect), so sending it again cannot count it twice.
        return result.status is None and isinstance(exc, httpx.TransportError)
    if usage is not None:
        result.prompt, result.cached = usage.prompt, usage.cached
    return False


def send(client: httpx.Client, base: str, line: TraceLine, api_key: str | None, *, attempts: int = ATTEMPTS) -> Result:
    """Send one trace request and read its usage; never raises for request failures.

    Like the OpenAI SDKs agents use, a request that got no response, or a 429 /
    502 / 503 / 504, is tried again (``attempts`` in all); each retried failure is
    kept in ``Result.retried`` so the report shows it.
    """
    body = copy.deepcopy(line.body)
    if line.exchange.stream_usage(body):  # usage is only reported when asked for
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    headers = request_headers(line, api_key)
    result = Result(line.line, line.kind, line.session)
    started = time.perf_counter()
    url = base.rstrip("/") + line.path
    for n in range(attempts):
        if not _attempt(client, url, body, headers, result) or n == attempts - 1:
            break
        result.retried.append(result.error or "")
        if result.status is not None:
            time.sleep(RETRY_BACKOFF_S * 2**n)
    result.wall_s = time.perf_counter() - started
    return result


def replay(
    lines: Iterable[TraceLine],
    report: Report,
    *,
    api_key: str | None,
    timeout_s: float,
    honor_timing: bool,
    progress: Progress,
) -> None:
    """Send ``lines`` in order (read one at a time), appending each :class:`Result` to ``report``."""
    t0: float | None = None
    start = time.monotonic()
    with httpx.Client(timeout=httpx.Timeout(timeout_s), trust_env=False) as client:
        for line in lines:
            if t0 is None:
                t0 = line.t
            if honor_timing:
                wait = (line.t - t0) - (time.monotonic() - start)
                if wait > 0:
                    time.sleep(wait)
            report.results.append(send(client, report.target, line, api_key))
            progress.advance(line.line - progress.done)


# -- reporting ----------------------------------------------------------------------
def _num(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _pct(cached: int | None, prompt: int | None) -> str:
    return "-" if not prompt or cached is None else f"{100 * cached / prompt:.1f}%"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def format_text(report: Report) -> str:
    """The human report: one row per request, then totals (overall, by kind, by role)."""
    res = report.results
    annotate = [name for name in ("kind", "session") if any(getattr(r, name) for r in res)]
    head = ["#", "line", *annotate, "role", "status", "prompt", "cached", "processed", "hit", "wall_s"]
    rows = [head]
    for i, r in enumerate(res, start=1):
        rows.append(
            [
                str(i),
                str(r.line),
                *[getattr(r, a) or "" for a in annotate],
                r.role or "-",
                str(r.status) if r.status is not None else "ERR",
                _num(r.prompt),
                _num(r.cached),
                _num(r.processed),
                _pct(r.cached, r.prompt),
                f"{r.wall_s:.3f}",
            ]
        )
    n = len(head)
    out = [f"replay -> {report.target}" + (f" (via prefixpin, upstream {report.upstream})" if report.via else "")]
    out += _table(rows, right={0, 1, n - 6, n - 5, n - 4, n - 3, n - 2, n - 1})
    out.append("")
    sums = [["total", "requests", "failed", "prompt", "cached", "processed", "hit", "wall_s"]]
    groups = [("all", report.totals())] + [(k, report.totals(k)) for k in ("kind", "role") if len(report.totals(k)) > 1]
    for key, totals in groups:
        for name, t in sorted(totals.items()):
            label = "all" if key == "all" else f"{key}={name}"
            sums.append(
                [
                    label,
                    str(t.requests),
                    str(t.failed),
                    _num(t.prompt),
                    _num(t.cached),
                    _num(t.processed),
                    _pct(t.cached, t.prompt),
                    f"{t.wall_s:.3f}",
                ]
            )
    out += _table(sums, right=set(range(1, 8)))
    for r in res:
        out += [f"line {r.line}: retried after: {e}" for e in r.retried]
        if r.error:
            out.append(f"line {r.line}: FAILED: {r.error}")
    for s in report.skipped:
        out.append(f"line {s['line']}: skipped: {s['error']}")
    return "\n".join(out)


def run_replay(
    trace: str,
    *,
    upstream: str,
    via: str | None,
    as_json: bool,
    progress: bool,
    api_key: str | None,
    timeout_s: float,
    honor_timing: bool,
) -> int:
    """The ``prefixpin replay`` command; returns the exit code (1: a request failed, 2: no trace)."""
    try:
        lines = Trace(trace, sys.stderr, "replay")
        report = Report(target=via or upstream, upstream=upstream, via=via, skipped=lines.skipped)
        with Progress(lines.lines, "replay", enabled=progress) as bar:
            replay(lines, report, api_key=api_key, timeout_s=timeout_s, honor_timing=honor_timing, progress=bar)
    except TraceError as exc:
        print(f"prefixpin replay: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_text(report))
    return 1 if any(not r.ok for r in report.results) else 0


__all__ = [
    "Report",
    "Result",
    "Totals",
    "TraceError",
    "TraceLine",
    "format_text",
    "read_trace",
    "run_replay",
    "send",
]
