"""One canonicalizer shared by the event loop and the worker threads that take the
big bodies (1-4 MiB are prepared and finalized off the loop): no memo ever fails a
request because another thread used it at the same time."""

from __future__ import annotations

import threading
from collections.abc import Callable

from canonicalize import CHAT, Canonicalizer, Lookup, Request, Settings
from tests.arrivals import VARIANTS, Arrivals, switching_often

REQUESTS = 20 * VARIANTS
BIG_EVERY = 8  # one request in 8 a worker takes is a big body


def _run(canon: Canonicalizer, raw: bytes, scope: str, *, worker: bool) -> str:
    """One request the way ``proxy.drive`` runs it: parsed whole on a worker thread
    (remembered nowhere), by pieces of its conversation's previous body on the loop; the
    store has nothing."""
    machine = canon.start(Request(raw, CHAT, scope, {}, "L1", remember=not worker))
    need = machine.send()
    while need is not None:
        need = machine.send(Lookup())
    assert machine.result is not None
    return machine.result.role


def _in_parallel(jobs: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as exc:  # every failure is the test's to report
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_big_bodies_on_workers_and_small_ones_on_the_loop_share_one_canonicalizer() -> None:
    """The loop takes small requests (parsed by pieces); three workers take the next
    request whatever it is, big or small (parsed whole): the memos see up to four
    threads at once, as they do when a big body is offloaded."""
    canon = Canonicalizer(Settings())
    arrivals = Arrivals(REQUESTS)
    roles: list[str] = []

    def loop() -> None:
        while (n := arrivals.take()) is not None:
            roles.append(_run(canon, arrivals.body(n, big=False), "tenant-a", worker=False))

    def worker() -> None:
        while (n := arrivals.take()) is not None:
            roles.append(_run(canon, arrivals.body(n, big=n % BIG_EVERY == 0), "tenant-b", worker=True))

    with switching_often():
        errors = _in_parallel([loop, worker, worker, worker])
    assert not errors, errors[:3]
    assert len(roles) == REQUESTS and set(roles) == {"root"}
