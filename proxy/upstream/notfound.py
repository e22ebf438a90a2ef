"""An upstream that answers a wire route with 404.

Most often ``upstream.url``'s path is wrong: with ``http://host:8080/v2`` every
chat completion goes to ``/v2/v1/chat/completions``, which no server has.  The
client gets the upstream's 404 as it came (upstream answers pass through
verbatim); the operator gets a WARNING that names the upstream path, at most one
per replica and path every ``every_s`` (with the count of those not logged), and
at most ``WARNINGS`` in all every ``every_s`` (paths that carry a name, such as a
deployment's, are many).

``/readyz`` reports a replica whose wire routes never answered but with such a
404 (:meth:`NotFound.missing`): it asks again (:meth:`Pool.health
<proxy.upstream.pool.Pool.health>`), so a replica that has the route by now is
ready again.  One that ever answered a wire route is not made unready by a 404
on another (an upstream without the Responses API still serves chat).

A 404 whose body names a model (OpenAI's ``model_not_found``, vLLM's "The model
`x` does not exist", Anthropic's ``not_found_error`` on a model) is the client's
model, not a missing route: it is logged with that hint and counts for nothing
else.  Time comes in as the clock argument.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from proxy.throttle import Throttle, Throttles

log = logging.getLogger("prefixpin")

EVERY_S = 60.0  # one warning per replica and path per minute
MAX_PATHS = 256  # (replica, path) pairs remembered; a wire path may carry a deployment name
WARNINGS = 8  # warnings in all per every_s, whatever the paths
_MODEL = re.compile(rb"model", re.IGNORECASE)
_READ = 4096  # bytes of the body looked at


class NotFound:
    """What the upstream's replicas answered wire routes with 404, and its warnings."""

    def __init__(self, *, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._paths = Throttles(every_s, max_keys=MAX_PATHS)  # per (replica, path)
        self._all = Throttle(every_s, WARNINGS)  # whatever the paths
        self._missing: dict[int, str] = {}  # replica -> the client path it had no route for
        self._served: set[int] = set()  # replicas that answered a wire route with less than 400

    def answered(self, replica: int, method: str, path: str, where: str, status: int, body: bytes) -> None:
        """Replica ``replica`` answered ``method path`` (sent to ``where``, the upstream
        URL without credentials or query) with ``status``; ``body``: the answer's start."""
        if status < 400:
            self._served.add(replica)
            self._missing.pop(replica, None)
            return
        if status != 404:
            return
        about_model = _MODEL.search(body[:_READ]) is not None
        if not about_model and replica not in self._served:
            self._missing[replica] = path
        self._warn(replica, method, path, where, about_model)

    def served(self, replica: int) -> bool:
        """``replica`` answered a wire route with less than 400 (nothing to watch then
        but 404s)."""
        return replica in self._served

    def missing(self, replica: int) -> str | None:
        """The client path ``replica`` answered with a route's 404, when none of its
        wire answers was a success."""
        return self._missing.get(replica)

    def found(self, replica: int) -> None:
        """Asked again, ``replica`` has the route now."""
        self._missing.pop(replica, None)

    def _warn(self, replica: int, method: str, path: str, where: str, about_model: bool) -> None:
        now = self.clock()
        seen = self._paths[(replica, path)]
        if not seen.ready(now):
            seen.held += 1  # told with this path's next warning
            return
        if not self._all.allow(now):  # held back: told with the next warning, whatever its path
            return
        seen.allow(now)
        more = f" ({seen.take_held()} more since the last warning)" if seen.held else ""
        if self._all.held:
            more += f" ({self._all.take_held()} more on other paths not warned of)"
        if about_model:
            hint = "its answer names a model: one the upstream does not serve?"
        else:
            hint = f"it has no such route: is upstream.url's path right? (prefixpin sends the client's {path} under it)"
        log.warning("the upstream answered 404 to %s %s: %s%s", method, where, hint, more)


__all__ = ["NotFound"]
