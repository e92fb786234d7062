"""When a poller should ask again (``Retry-After``) and how long a cache may keep a status
(``Cache-Control``): pure functions of a :class:`~jobpulse.JobStatus`, no I/O.

The ``Retry-After`` rule (docs/gateway.md repeats it):

1. **Base, by job age.** The seed's schedule, ``Backoff()`` without jitter: 0.5, 0.75, 1.125,
   1.69, 2.53, 3.8, 5, 5, … s. A client that began polling when the job started would, at the
   job's age ``a`` (``server_ms - started_ms``, both Redis server time), be waiting the step
   ``d_k`` whose cumulative start ``d_0 + … + d_(k-1)`` is the last one ``<= a``. Age is used
   rather than a per-client counter because an HTTP server keeps no state per client, and it
   lets a client that joins late start at the long delay a job of that age deserves.
2. **Shortened near the end.** When the worker's ETA is below the base, the base becomes the
   ETA: ask again when the job should be done.
3. **Jittered.** ``d = base * (1 + jitter * (2u - 1))`` with ``u`` uniform in ``[0, 1)``
   (``jitter`` 0.1, as ``Backoff``).
4. **Whole seconds.** ``Retry-After = min(5, max(1, floor(d + v)))`` with ``v`` uniform in
   ``[0, 1)``: randomised rounding, so the mean stays ``d`` and a crowd that shares one ``d``
   still spreads over two neighbouring seconds instead of all rounding the same way.

Only a job that may still change gets one: RUNNING and STALE (a sweeper may yet claim it).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random

from .._reader.backoff import Backoff
from .._reader.status import LIVE_STATES, JobState, JobStatus

__all__ = ["RETRY_MAX", "RETRY_MIN", "base_delay", "cache_control", "retry_after"]

RETRY_MIN = 1
"""The smallest ``Retry-After`` sent, in seconds (HTTP counts whole seconds)."""
RETRY_MAX = 5
"""The largest ``Retry-After`` sent: the cap of the seed's schedule."""
JITTER = 0.1

_STEPS = list(itertools.islice(Backoff(jitter=0.0), 12))  # reaches the 5 s cap by step 6
_STARTS = list(itertools.accumulate([0.0, *_STEPS[:-1]]))


def base_delay(age: float | None) -> float:
    """The seed's backoff step a poller would be at ``age`` seconds into the job (step 1)."""
    if age is None or age < 0:
        return _STEPS[0]
    return _STEPS[bisect.bisect_right(_STARTS, age) - 1]


def retry_after(status: JobStatus, rng: random.Random) -> int | None:
    """The ``Retry-After`` (whole seconds, 1 to 5) for ``status``; None when it will not change
    again by itself (a terminal state, or UNKNOWN).

    Args:
        status: the status being answered.
        rng: the random source of the jitter and the rounding.
    """
    if status.state not in LIVE_STATES:
        return None
    age = None
    if status.started_ms is not None and status.server_ms is not None:
        age = (status.server_ms - status.started_ms) / 1000
    delay = base_delay(age)
    if status.eta is not None and status.eta < delay:
        delay = max(status.eta, 0.0)
    delay *= 1.0 + JITTER * (2.0 * rng.random() - 1.0)
    return min(RETRY_MAX, max(RETRY_MIN, math.floor(delay + rng.random())))


def cache_control(status: JobStatus, *, ttl: float, terminal_ttl: float, stale: float) -> str:
    """``Cache-Control`` of a status response.

    ``max-age`` is the reader's cache ttl (its terminal ttl for a terminal state) rounded down to
    whole seconds, so no HTTP cache keeps a status longer than the reader itself would;
    ``stale-while-revalidate`` lets a cache answer from a copy up to ``stale`` seconds past that
    while it fetches the next one in the background. UNKNOWN is never stored (``no-store``): the
    job may start the next moment.
    """
    if status.state is JobState.UNKNOWN:
        return "no-store"
    max_age = math.floor(terminal_ttl if status.state.is_terminal else ttl)
    if stale <= 0:
        return f"max-age={max_age}"
    return f"max-age={max_age}, stale-while-revalidate={math.ceil(stale)}"
