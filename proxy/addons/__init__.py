"""The request path as an ordered tuple of small addons (mitmproxy's model).

    ADDONS = (Bypass, Tenancy, Canonicalize, StreamUsage, ProviderCache, ForkGuard, Affinity, Measure, Record,
              Trace)

``Trace`` is there only with ``trace.path`` (proxy.recording).

The tuple *is* the execution order.  Each addon says what it ``needs`` (the
decisions it reads: :mod:`proxy.flow`) and what it ``provides``; :func:`build`
checks that every addon comes after one that provides each of its needs, so a
tuple in a wrong order is refused when the app is built.  An addon implements
one or both hooks (:mod:`proxy.addons.runner`):

- ``request(flow)``: before the upstream, decides what goes out (it returns None,
  or what the runner awaits when it waits on I/O: the core's store calls);
- ``done(flow)``: once the response is over, counts or records (it returns None,
  or what the runner awaits: a record's write); ``when`` says at which moment:
  ``before_last_byte`` (awaited before the client's last bytes go out),
  ``after_last_byte`` (right after them, before the process reads the client's
  next request), or ``counted`` (off the request's path: one queue, one task,
  :mod:`proxy.addons.counting`).  The record's moment is the store's
  (``Store.records_at``).

One :class:`Runner` runs every hook and fails open: a request hook that raises
leaves the flow forwarded as the client sent it (``x-prefixpin-role: fail-open``,
``prefixpin_fail_open_total{stage=<addon name>}``); a done hook that raises costs
only that addon's work.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.addons.affinity import Affinity
from proxy.addons.bypass import Bypass
from proxy.addons.canonicalize import Canonicalize
from proxy.addons.fork_guard import ForkGuard
from proxy.addons.measure import Measure
from proxy.addons.provider_cache import ProviderCache
from proxy.addons.record import Record
from proxy.addons.runner import Addon, DoneHook, RequestHook, Runner
from proxy.addons.stream_usage import StreamUsage
from proxy.addons.tenancy import Tenancy
from proxy.addons.trace import Trace
from proxy.drive import Driver
from proxy.flow import Inbound
from proxy.services import Services


class OrderError(ValueError):
    """An addon comes before every addon that provides one of its needs."""


def build(s: Services, *, new_id: Callable[[], str] | None = None) -> tuple[Addon, ...]:
    """The addons of one app, in execution order (checked: :func:`check_order`).
    ``new_id``: lineage ids."""
    driver = Driver(s.canon, s.store, s.guard, s.metrics, new_id=new_id)
    addons: tuple[Addon, ...] = (
        Bypass(),
        Tenancy(s.config.tenancy),
        Canonicalize(driver, max_bytes=s.config.limits.canonicalize_max_bytes),
        StreamUsage(),
        ProviderCache(s),
        ForkGuard(),
        Affinity(s.config.affinity, s.slots),
        Measure(s.metrics),
        Record(s, driver),
    )
    if s.recorder is not None:
        addons = (*addons, Trace(s.recorder))
    check_order(addons)
    return addons


def check_order(addons: tuple[Addon, ...]) -> None:
    """Raise :class:`OrderError` unless each addon's needs are provided before it (the
    handler provides the :class:`~proxy.flow.Inbound` request)."""
    provided: set[type] = {Inbound}
    for addon in addons:
        missing = [kind.__name__ for kind in addon.needs if kind not in provided]
        if missing:
            raise OrderError(f"addon {addon.name} needs {', '.join(missing)}, which no addon before it provides")
        provided.update(getattr(addon, "provides", ()))


__all__ = ["Addon", "DoneHook", "OrderError", "RequestHook", "Runner", "build", "check_order"]
