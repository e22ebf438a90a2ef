"""``affinity.llama_slots``: each replica's ``/props`` and ``/slots``, read off the request path.

:class:`SlotWatch` reads every replica once when the app starts.  A fresh server
(every slot empty, none ever ran a task) cannot be told apart by reading alone, so
the first read asks it: two one-token completions of a fixed 8-word prompt
(:data:`PROBE`), to slot 0 and then to slot 1, with a read of ``/slots`` after each.
Whether slot 0 still holds its prompt once the second task started decides
(proxy.upstream.slots).  A server that ran anything is never probed: its own tasks
tell.  Requests that arrive before that first read (and probe) are done wait for it,
at most ``SETTLE_WAIT_S``.  Then the watch reads after
responses (the affinity addon's done hook calls :meth:`SlotWatch.poke`), one read at
a time: while prefixpin pins carefully, after every response (at most every
``UNDECIDED_EVERY_S``; a response that ends during a read asks for one more); while
a replica has not answered yet, at most every ``UNHEARD_EVERY_S``; then at most every
``DECIDED_EVERY_S`` (a restarted server, a slot count that changed, a server seen to
clear its slots after all).  It also keeps what was last sent to the servers
(:attr:`SlotWatch.last_sent`), which careful pinning needs.
The request path reads :attr:`SlotWatch.plan` and never waits on a read.  What the
reads mean and what prefixpin does with them: proxy.upstream.slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import orjson

from proxy.errors import UpstreamError
from proxy.upstream.client import UpstreamClient
from proxy.upstream.slots import Judge, SlotPlan, combine, parse_slots, parse_total, plan

log = logging.getLogger("prefixpin")
UNDECIDED_EVERY_S = 0.02
UNHEARD_EVERY_S = 1.0
DECIDED_EVERY_S = 10.0
READ_TIMEOUT_S = 2.0
SETTLE_WAIT_S = 3.0  # how long a request at start waits for the first read and probe
PROBE_PROMPT = "prefixpin asks which slots keep their prompts."
_NOT_SERVED = frozenset({404, 405, 501})  # llama-server --no-slots answers 501


class SlotWatch:
    """The replicas' slots as last read, and the :class:`SlotPlan` they make."""

    def __init__(
        self,
        clients: Sequence[UpstreamClient],
        configured: int | Literal["auto"],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clients = clients
        self.configured = configured
        self.clock = clock
        self.judges = [Judge() for _ in clients]
        self.totals: list[int | None] = [None] * len(clients)
        self.plan = plan(configured, "unknown", None)
        self.reads = 0  # completed reads of every replica (tests wait on it)
        # The last request sent to the servers: its lineage root and the slot it named
        # (None: a request without a lineage, or one prefixpin does not route, e.g.
        # passthrough).  Careful pinning sends a lineage back to its slot only when it
        # was the last one sent there.
        self.last_sent: tuple[str, int | None] | None = None
        self._answered = [False] * len(clients)  # /slots answered (or refused) at least once
        self._probed = [False] * len(clients)
        self.settled = asyncio.Event()  # set once the first read (and probe) is done
        self._last = -float("inf")
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def start(self) -> None:
        """The first read (and probe), in the background."""
        self._spawn()

    async def settle(self) -> None:
        """Wait (at most ``SETTLE_WAIT_S``) for the first read; at once after it."""
        if not self.settled.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), SETTLE_WAIT_S)

    def poke(self) -> None:
        """A response ended: read again when due (never waits)."""
        careful = self.plan.mode == "careful"
        if self._task is not None:
            self._again = careful
            return
        every = UNDECIDED_EVERY_S if careful else UNHEARD_EVERY_S if not all(self._answered) else DECIDED_EVERY_S
        if self.clock() - self._last >= every or careful:
            self._spawn()

    def _spawn(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                wait = self._last + UNDECIDED_EVERY_S - self.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last = self.clock()
                await self.read()
                if not self._again:
                    return
        except Exception:
            log.exception("reading the llama-server slots failed")
        finally:
            self._task = None
            self.settled.set()

    async def read(self) -> SlotPlan:
        """Read every replica once; the plan they make now."""
        for i, client in enumerate(self.clients):
            props = await _get(client, "/props")
            if props is not None and (props[0] < 400 or props[0] in _NOT_SERVED):
                self.totals[i] = parse_total(props[1]) if props[0] < 400 else None
            got = await _get(client, "/slots")
            if got is None:
                continue  # no answer now: judged on the next read
            status, data = got
            slots = parse_slots(data) if status < 400 else None
            if slots is not None:
                self.judges[i].see(slots)
                if not self._probed[i] and len(slots) > 1 and all(s.task is None for s in slots):
                    self._probed[i] = True
                    await self._probe(client, self.judges[i])
            elif status < 400 or status in _NOT_SERVED:
                self.judges[i].blind()
            else:
                continue  # e.g. 503 while the model loads
            self._answered[i] = True
        totals = [t for t in self.totals if t is not None]
        new = plan(self.configured, combine([j.verdict for j in self.judges]), min(totals) if totals else None)
        if (new.mode, new.slots) != (self.plan.mode, self.plan.slots):
            pins = {"all": "pinning every lineage", "careful": "pinning carefully", "none": "not pinning"}[new.mode]
            log.info("affinity.llama_slots: %s to %d slot(s) of llama-server: %s", pins, new.slots, new.why)
        self.plan = new
        self.reads += 1
        return new

    async def _probe(self, client: UpstreamClient, judge: Judge) -> None:
        """Slot 0, then slot 1, a one-token completion each, ``/slots`` read after each."""
        for slot in (0, 1):
            body = orjson.dumps({"prompt": PROBE_PROMPT, "n_predict": 1, "id_slot": slot, "cache_prompt": True})
            if await _post(client, "/completion", body) is None:
                return
            self.last_sent = None  # it ran on a slot: careful pinning cannot count on the last
            got = await _get(client, "/slots")
            slots = parse_slots(got[1]) if got is not None and got[0] < 400 else None
            if slots is None:
                return
            judge.see(slots)
        log.info("affinity.llama_slots: probed a fresh llama-server's slots: %s", judge.verdict)

    async def aclose(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _get(client: UpstreamClient, path: str) -> tuple[int, Any] | None:
    """``(status, JSON or None)``; None when the server did not answer."""
    return await _call(client, "GET", path, b"")


async def _post(client: UpstreamClient, path: str, body: bytes) -> tuple[int, Any] | None:
    got = await _call(client, "POST", path, body)
    return got if got is not None and got[0] < 400 else None


async def _call(client: UpstreamClient, method: str, path: str, content: bytes) -> tuple[int, Any] | None:
    headers = [("accept", "application/json")]
    if content:
        headers.append(("content-type", "application/json"))
    try:
        resp = await client.send(method, path, "", headers, content, timeout=READ_TIMEOUT_S)
        body = await resp.read()
    except (UpstreamError, TimeoutError):
        return None
    except Exception as exc:  # an upstream that is no llama-server (upstream.kind: litellm) may fail otherwise
        log.debug("reading %s failed: %r", path, exc)
        return None
    try:
        return resp.status, orjson.loads(body)
    except orjson.JSONDecodeError:
        return resp.status, None


__all__ = ["DECIDED_EVERY_S", "PROBE_PROMPT", "SlotWatch"]
