"""proxy.upstream.notfound: a wire route's 404 is warned about once a minute per path,
and marks the replica as missing the route only while none of its wire answers succeeded."""

from __future__ import annotations

import logging

import pytest

from proxy.upstream.notfound import MAX_PATHS, NotFound

WHERE = "http://127.0.0.1:8080/v2/v1/chat/completions"
PATH = "/v1/chat/completions"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_one_warning_per_path_a_minute_with_the_count_between(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    nf = NotFound(clock=clock)
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        for _ in range(5):
            nf.answered(0, "POST", PATH, WHERE, 404, b'{"error":{"message":"File Not Found"}}')
        assert _warnings(caplog) == [
            f"the upstream answered 404 to POST {WHERE}: it has no such route: is upstream.url's path right? "
            f"(prefixpin sends the client's {PATH} under it)"
        ]
        nf.answered(0, "POST", "/v1/responses", WHERE.replace("chat/completions", "responses"), 404, b"")
        assert len(_warnings(caplog)) == 2  # another path: its own warning
        clock.now += 60
        nf.answered(0, "POST", PATH, WHERE, 404, b"")
    assert _warnings(caplog)[-1].endswith("(4 more since the last warning)")
    assert nf.missing(0) == PATH


def test_a_model_404_warns_with_its_hint_and_marks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    nf = NotFound(clock=Clock())
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        nf.answered(0, "POST", PATH, WHERE, 404, b'{"error":{"code":"model_not_found"}}')
    assert _warnings(caplog) == [
        f"the upstream answered 404 to POST {WHERE}: its answer names a model: one the upstream does not serve?"
    ]
    assert nf.missing(0) is None


def test_a_replica_that_served_a_wire_route_is_never_missing_one(caplog: pytest.LogCaptureFixture) -> None:
    nf = NotFound(clock=Clock())
    nf.answered(1, "POST", PATH, WHERE, 404, b"")
    assert (nf.missing(0), nf.missing(1)) == (None, PATH)
    nf.answered(1, "POST", PATH, WHERE, 200, b"")
    assert nf.missing(1) is None and nf.served(1)
    nf.answered(1, "POST", "/v1/responses", WHERE, 404, b"")  # a route it lacks beside the ones it serves
    assert nf.missing(1) is None
    nf.answered(0, "POST", PATH, WHERE, 500, b"")  # other errors are not about the route
    assert nf.missing(0) is None and not nf.served(0)


def test_found_clears_the_mark() -> None:
    nf = NotFound(clock=Clock())
    nf.answered(0, "POST", PATH, WHERE, 404, b"")
    nf.found(0)
    assert nf.missing(0) is None


def test_paths_remembered_are_bounded(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most MAX_PATHS (replica, path) pairs: past it they are forgotten (a forgotten
    path warns again), so a client inventing paths cannot grow the memory."""
    monkeypatch.setattr("proxy.upstream.notfound.WARNINGS", 10**6)  # (the limit on all warnings: another test)
    nf = NotFound(clock=Clock())
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        nf.answered(0, "POST", PATH, WHERE, 404, b"")
        nf.answered(0, "POST", PATH, WHERE, 404, b"")
        assert len(_warnings(caplog)) == 1
        for i in range(MAX_PATHS):
            nf.answered(0, "POST", f"/openai/deployments/d{i}/chat/completions", WHERE, 404, b"")
        nf.answered(0, "POST", PATH, WHERE, 404, b"")
    assert len(_warnings(caplog)) == MAX_PATHS + 2


def test_at_most_a_few_warnings_a_minute_whatever_the_paths(caplog: pytest.LogCaptureFixture) -> None:
    """A path may carry a name (an Azure deployment's): a client cycling names gets past
    the per-path limit, not past the limit on all warnings; the next warning counts them."""
    from proxy.upstream.notfound import WARNINGS

    clock = Clock()
    nf = NotFound(clock=clock)
    with caplog.at_level(logging.WARNING, logger="prefixpin"):
        for n in range(100):
            path = f"/openai/deployments/d{n}/chat/completions"
            nf.answered(0, "POST", path, "http://up" + path, 404, b"")
        assert len(_warnings(caplog)) == WARNINGS
        clock.now += 60
        nf.answered(0, "POST", PATH, WHERE, 404, b"")
    assert len(_warnings(caplog)) == WARNINGS + 1
    assert _warnings(caplog)[-1].endswith(f"({100 - WARNINGS} more on other paths not warned of)")
