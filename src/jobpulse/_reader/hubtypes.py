"""The watch hub's types: what it keeps per followed stream and per watcher, and its counters.

The hub (``routing.WatchHub``) routes each :class:`Stream` to an XREAD loop (``xread.XReadLoop``),
which hands every entry to the stream's :class:`Watcher` queues; a ``watch.Watch`` consumes one
queue. Each of those modules imports this one, never the other way round.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .event import Event

__all__ = ["EntryKey", "HubStatistics", "Item", "Stream", "StreamLoop", "Watcher"]

Item = Event | BaseException
"""What a watcher's queue holds: an event, or an error to raise."""

EntryKey = tuple[int, int] | None
"""An event's parsed stream id, parsed once by the hub for all the watchers of a stream
(None for an error or a synthetic event)."""


@dataclass(frozen=True, slots=True)
class HubStatistics:
    """Counters of one watch hub.

    Attributes:
        streams: streams followed now.
        watchers: watchers attached now.
        xreads: XREAD calls sent.
        unblocks: CLIENT UNBLOCK calls sent.
        liveness_checks: liveness pipelines sent.
        overflows: watchers dropped because their queue was full (they resync by id).
        loops: XREAD loops (dedicated connections): 1 on a single Redis, one per master
            followed on a cluster.
        reroutes: MOVED, ASK, TRYAGAIN or CLUSTERDOWN replies that made a loop re-resolve.
    """

    streams: int
    watchers: int
    xreads: int
    unblocks: int
    liveness_checks: int
    overflows: int
    loops: int = 1
    reroutes: int = 0


class Watcher:
    """The hub's side of one watcher: its bounded queue and where it is attached.

    The queue is a plain deque with at most one waiting future: the hub appends without any
    await and wakes the watcher only when it waits (with 1,000 watchers of one job, each entry
    costs 1,000 appends and as many task wake-ups, nothing more)."""

    __slots__ = ("failure", "items", "overflowed", "size", "stream", "waiter")

    def __init__(self, queue_size: int) -> None:
        self.items: deque[tuple[Item, EntryKey]] = deque()
        self.size = queue_size
        self.waiter: asyncio.Future[None] | None = None
        self.stream: Stream | None = None
        self.overflowed = False
        self.failure: BaseException | None = None

    def offer(self, entry: tuple[Item, EntryKey]) -> bool:
        """Queue ``entry`` (an item and its parsed id; one tuple shared by every watcher of the
        stream); False (and detached) when the queue is full."""
        if len(self.items) >= self.size:
            self.overflowed = True
            self.stream = None
            return False
        self.items.append(entry)
        waiter = self.waiter
        if waiter is not None:  # _wake(), inlined: the hub calls this once per watcher
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return True

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self.stream = None
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """A future done at the next offer or failure."""
        self.waiter = waiter = asyncio.get_running_loop().create_future()
        return waiter


class StreamLoop(Protocol):
    """The XREAD loop that follows a stream (``xread.XReadLoop``), as the hub calls it."""

    def wake(self, stream: Stream) -> None: ...

    def discard(self, stream: Stream) -> None: ...


@dataclass(eq=False, slots=True)
class Stream:
    """One followed stream: its keys, the hub's cursor in it, its watchers and its loop."""

    key: str
    state_key: str
    alive_key: str
    cursor: str
    watchers: set[Watcher]
    slot: int = 0
    loop: StreamLoop | None = None
