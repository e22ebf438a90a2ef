"""``bench_inprocess --compare-ref``'s driver: the requests of a file through one tree's request path.

    PYTHONPATH=TREE python -P benchmarks/inprocess_ref.py JOB.json    # prints {"MIB": µs per request, ...}

Run as a script in a process of its own, with ``PYTHONPATH`` naming the tree to
measure (this one, or a revision ``git archive`` exported): it imports nothing of
``benchmarks`` and of that tree only what every revision since the request path was
driven offline has (``proxy.config.load``, ``proxy.offline.Offline`` and its
``send``), so both sides run the same loop.  The job file gives the bodies (as wrk
sends them), the headers, the reply, how many are warm-up, the cyclic collector's
thresholds (``prefixpin serve``'s, frozen first as it does) and the MiB to write
between two requests (:func:`timed`, the loop ``bench_inprocess --evict`` runs in
process too: the body freshly copied, each request timed alone by the thread's CPU
clock).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from typing import Any


async def measure(job: dict[str, Any]) -> dict[str, float]:
    """µs of CPU per timed request, for each amount of MiB in ``job["evict_mib"]``."""
    from proxy.config import load
    from proxy.offline import Offline

    bodies = [b.encode() for b in job["bodies"]]
    warm, headers, reply = job["warm"], job["headers"], job["reply"]
    found: dict[str, float] = {}
    for mib in job["evict_mib"]:
        offline = Offline(load(None, env={}))  # a fresh memo and store for each amount
        for raw in bodies[:warm]:
            await offline.send(raw, headers=headers, reply=reply)
        found[f"{mib:g}"] = await timed(offline, bodies[warm:], headers, reply, int(mib * (1 << 20)))
    return found


async def timed(offline: Any, bodies: list[bytes], headers: dict[str, str], reply: Any, evict: int) -> float:
    """µs of CPU per request of ``bodies`` through ``offline`` (a ``proxy.offline.Offline``),
    ``evict`` bytes of other memory written before each (untimed)."""
    source, scratch = bytes(evict), bytearray(evict)
    spent = 0
    for raw in bodies:
        scratch[:] = source  # other work's memory through the caches
        fresh = bytes(bytearray(raw))  # the body as a socket read leaves it: just written
        t0 = time.thread_time_ns()
        await offline.send(fresh, headers=headers, reply=reply)
        spent += time.thread_time_ns() - t0
    return spent / 1000 / len(bodies)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    gc.freeze()
    gc.set_threshold(*job["gc_threshold"])
    print(json.dumps(asyncio.run(measure(job))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
