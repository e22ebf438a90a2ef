"""What prefixpin made of a workload: the roles it gave the requests.

Two views, both from prefixpin itself:

- :func:`sample`: send a workload's first requests one at a time, in the load
  generator's order, and read each answer's ``x-prefixpin-role`` header.  For the
  mix, two turns of every conversation: the first turn is a root, the second
  must be a continuation, or the mix does not measure what it claims.
- :func:`counted`: ``prefixpin_requests_total`` by role from ``/metrics``; the
  difference over a measured run is the role of every request in it.
"""

from __future__ import annotations

import re
from collections import Counter

import httpx

from benchmarks.overhead import wrk
from benchmarks.overhead.targets import CHAT, CLIENT_HEADERS, Target
from benchmarks.overhead.workloads import Workload

_REQUESTS = re.compile(r"^prefixpin_requests_total\{([^}]*)\} (\S+)$", re.M)
_ROLE = re.compile(r'role="([^"]*)"')


def sample(base: str, workload: Workload, *, start: int, count: int) -> Counter[str]:
    """Roles (and ``status_<code>`` for an answer other than 200) of requests ``start`` ... ``start+count-1``."""
    seen: Counter[str] = Counter()
    headers = {**CLIENT_HEADERS, "Content-Type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=30, trust_env=False) as client:
        for n in range(start, start + count):
            resp = client.post(CHAT, content=workload.render(n).encode())
            if resp.status_code != 200:
                seen[f"status_{resp.status_code}"] += 1
            seen[resp.headers.get("x-prefixpin-role", "none")] += 1
    return seen


def prime(base: str, workload: Workload, *, start: int) -> None:
    """Send request ``start`` of each template (session or conversation) once, one at
    a time, as an agent sends its conversation's first request.  A load generator's
    connections would otherwise send a session's first requests at once, each a root
    of its own, and those lineages would share every link from then on (the store
    walks for them): a race of the run's first second, not of an agent's traffic."""
    sample(base, workload, start=start, count=len(workload.templates))


def warm_up(target: Target, workload: Workload, *, conns: int, start: int, seconds: int) -> None:
    """Each session's first request alone (:func:`prime`), then ``seconds`` of wrk at
    ``conns`` connections, from request number ``start`` on (numbers no measured run
    uses, so every measured request continues a session warmed here or started anew)."""
    assert target.base is not None
    prime(target.base, workload, start=start)
    wrk.run(
        target.url,
        workload.path,
        conns=conns,
        duration_s=seconds,
        start=start,
        headers={**CLIENT_HEADERS, **target.headers},
    )


def counted(base: str) -> Counter[str] | None:
    """Requests handled so far, by role (None when /metrics does not answer in time)."""
    try:
        text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    except httpx.HTTPError:
        return None
    out: Counter[str] = Counter()
    for labels, value in _REQUESTS.findall(text):
        role = _ROLE.search(labels)
        out[role.group(1) if role else "none"] += int(float(value))
    return out


def share(roles: Counter[str] | dict[str, int]) -> str:
    """``"continuation 87%, root 13%"``: the roles of a run, largest first."""
    total = sum(roles.values())
    if not total:
        return "-"
    return ", ".join(f"{role} {100 * n / total:.0f}%" for role, n in Counter(roles).most_common() if n)


__all__ = ["counted", "sample", "share"]
