"""The heartbeat's options, declared once.

:class:`HeartbeatOptions` is what ``heartbeat(redis, job_id, **options)`` and
``jobpulse.sync.heartbeat(client, job_id, **options)`` accept (``Unpack``: mypy refuses a
misspelt or mistyped option); :class:`HeartbeatSpec` holds them with their defaults, and is what
the factories hand to the shells' constructors and the shells to
:class:`~jobpulse._worker.machine.BeatMachine`, which checks every value before any I/O. A new
option is one line in each (a test ties the two together), its checks in ``BeatMachine`` or
``HeartbeatConfig``, and one line of ``heartbeat()``'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

__all__ = ["HeartbeatOptions", "HeartbeatSpec"]


class HeartbeatOptions(TypedDict, total=False):
    """The keyword options of both heartbeat factories (documented on ``heartbeat()``)."""

    total: int | None
    interval: float
    ttl: float
    namespace: str
    meta: Any
    kind: str
    worker: str | None
    stream_every: int
    maxlen: int
    retention: float
    max_meta_bytes: int
    max_details_bytes: int
    final_timeout: float
    index_every: int
    index_shards: int
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatSpec:
    """:class:`HeartbeatOptions` with their defaults (not yet checked: ``BeatMachine`` checks
    them). An unknown option is a ``TypeError`` here, before any Redis command."""

    total: int | None = None
    interval: float = 1.0
    ttl: float = 6.0
    namespace: str = "jobpulse"
    meta: Any = None
    kind: str = ""
    worker: str | None = None
    stream_every: int = 10
    maxlen: int = 1000
    retention: float = 3600.0
    max_meta_bytes: int = 64 * 1024
    max_details_bytes: int = 64 * 1024
    final_timeout: float = 30.0
    index_every: int = 10
    index_shards: int = 1
    clock: Callable[[], float] = time.monotonic
