"""The reader's snapshot cache: size-capped LRU, per-entry TTL, single flight, monotonic guard.

Invariants (for one key, while its entry is in the cache):
  * a value handed out never has a lower ``version`` than one handed out before, unless a read
    taken later by the server's clock says the snapshot is gone (``exists`` false): then the
    guard starts over (a job id that comes back after its snapshot expired has a higher fence
    anyway: fences grow over an id's whole life, see docs/protocol.md);
  * at most one fetch per key is in flight for any set of fields a caller waits for: a miss joins
    an in-flight fetch whose fields cover its own (single flight), unless caching is disabled or
    the caller asked for a read that starts after its call;
  * an entry answers a hit only for fields it holds, and only within its TTL (``terminal_ttl``
    for a terminal snapshot).

The cache knows nothing about Redis: ``fetch`` is a callable, so the logic is unit-tested
without a server.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["CacheStatistics", "SnapshotCache", "Versioned"]


class Versioned(Protocol):
    """What the cache needs to know about a fetched value."""

    @property
    def fields(self) -> frozenset[str]: ...
    @property
    def version(self) -> tuple[int, int]: ...
    @property
    def exists(self) -> bool: ...
    @property
    def server_ms(self) -> int: ...
    @property
    def terminal(self) -> bool: ...


V = TypeVar("V", bound=Versioned)

_RETRIES = 3
"""Fetches per miss when racing replies keep answering with an older snapshot that lacks fields."""


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    """Counters of one cache.

    Attributes:
        hits: reads answered from memory.
        misses: reads that waited for a fetch (their own, or one they joined).
        fetches: Redis round trips made.
        joined: misses that joined a fetch already in flight (single flight).
        kept_newer: replies older than what was already handed out (the guard served the newer).
        entries: keys held now.
    """

    hits: int
    misses: int
    fetches: int
    joined: int
    kept_newer: int
    entries: int


@dataclass(eq=False, slots=True)
class _Flight(Generic[V]):
    """One fetch in flight: the fields it reads, its outcome, and how many callers joined it."""

    fields: frozenset[str]
    future: asyncio.Future[tuple[V, float]]
    joiners: int = 0


@dataclass(slots=True)
class _Slot(Generic[V]):
    value: V
    fetched_at: float


class SnapshotCache(Generic[V]):
    """Single-flight LRU cache of versioned snapshots.

    Args:
        ttl: seconds an entry answers hits (0: never; reads still go through the guard).
        terminal_ttl: the same for a terminal snapshot.
        max_entries: keys kept (least recently used evicted first).
        merge: combines two values of the same version, ``merge(older, newer)``: the union of
            their fields, with the newer read's liveness.
        clock: the monotonic clock (a seam for tests).
    """

    def __init__(
        self,
        *,
        ttl: float,
        terminal_ttl: float,
        max_entries: int,
        merge: Callable[[V, V], V],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._terminal_ttl = terminal_ttl
        self._max = max_entries
        self._merge = merge
        self._clock = clock
        self._entries: OrderedDict[str, _Slot[V]] = OrderedDict()
        self._inflight: dict[str, list[_Flight[V]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._hits = self._misses = self._fetches = self._joined = self._kept = 0

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            self._hits, self._misses, self._fetches, self._joined, self._kept, len(self._entries)
        )

    def peek(self, key: str) -> V | None:
        """The entry of ``key`` whatever its age (no LRU touch), or None."""
        slot = self._entries.get(key)
        return None if slot is None else slot.value

    def hit(self, key: str, want: frozenset[str], *, fresh: bool = False) -> tuple[V, float] | None:
        """The cached value of ``key`` and its age when it holds ``want`` and is young enough
        (counted as a hit), else None (counted as a miss). Shared by the sync reader."""
        now = self._clock()
        slot = self._entries.get(key)
        if not fresh and slot is not None and want <= slot.value.fields:
            age = now - slot.fetched_at
            if age < (self._terminal_ttl if slot.value.terminal else self._ttl):
                self._entries.move_to_end(key)
                self._hits += 1
                return slot.value, age
        self._misses += 1
        return None

    def admit(self, key: str, new: V) -> tuple[V, float]:
        """Store a value fetched outside :meth:`get` (the sync reader); never back in time."""
        self._fetches += 1
        return self._admit(key, new)

    async def get(
        self,
        key: str,
        want: frozenset[str],
        fetch: Callable[[frozenset[str]], Awaitable[V]],
        *,
        fresh: bool = False,
    ) -> tuple[V, float]:
        """The value of ``key`` holding at least the fields ``want``, and its age in seconds.

        Args:
            key: the cache key (a job id).
            want: the fields the caller needs.
            fetch: reads ``want`` from Redis (one round trip).
            fresh: skip the cache and any fetch in flight: the read starts after this call.
        """
        cached = self.hit(key, want, fresh=fresh)
        if cached is not None:
            return cached
        if self._ttl <= 0:
            # Nothing is ever joined without a cache (see below): no flight to register.
            return await self._load(key, want, fetch)
        if not fresh:
            for flight in self._inflight.get(key, ()):
                if want <= flight.fields:
                    self._joined += 1
                    flight.joiners += 1
                    return await asyncio.shield(flight.future)
        # The first caller fetches in its own task (no extra task, no extra loop iteration);
        # callers that join wait on ``future``. If the first caller is cancelled while others
        # wait, a task takes the fetch over for them.
        flight = _Flight(want, asyncio.get_running_loop().create_future())
        self._inflight.setdefault(key, []).append(flight)
        try:
            result = await self._load(key, want, fetch)
        except asyncio.CancelledError:
            self._unregister(key, flight)
            self._hand_over(key, fetch, flight)
            raise
        except BaseException as exc:
            self._unregister(key, flight)
            flight.future.set_exception(exc)
            flight.future.exception()  # retrieved: nobody may be waiting
            raise
        self._unregister(key, flight)
        flight.future.set_result(result)
        return result

    def _unregister(self, key: str, flight: _Flight[V]) -> None:
        waiting = self._inflight.get(key)
        if waiting is not None:
            waiting.remove(flight)
            if not waiting:
                del self._inflight[key]

    def _hand_over(
        self, key: str, fetch: Callable[[frozenset[str]], Awaitable[V]], flight: _Flight[V]
    ) -> None:
        """The first caller was cancelled: finish the fetch in a task for whoever joined."""
        future = flight.future
        if not flight.joiners:
            future.cancel()
            return
        self._inflight.setdefault(key, []).append(flight)

        async def finish() -> None:
            try:
                future.set_result(await self._load(key, flight.fields, fetch))
            except BaseException as exc:  # every outcome goes to the joiners
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()
            finally:
                self._unregister(key, flight)

        self._tasks.add(task := asyncio.get_running_loop().create_task(finish()))
        task.add_done_callback(self._tasks.discard)

    async def _load(
        self, key: str, want: frozenset[str], fetch: Callable[[frozenset[str]], Awaitable[V]]
    ) -> tuple[V, float]:
        for _ in range(_RETRIES):
            value = await fetch(want)
            self._fetches += 1
            served, age = self._admit(key, value)
            if want <= served.fields:
                break
        return served, age

    def _admit(self, key: str, new: V) -> tuple[V, float]:
        """Store a fetched value under the guard; return what to hand out and its age."""
        now = self._clock()
        slot = self._entries.get(key)
        if slot is None:
            return self._store(key, new, now), 0.0
        old = slot.value
        newer_read = new.server_ms >= old.server_ms
        if not new.exists or not old.exists:
            if newer_read:
                return self._store(key, new, now), 0.0
            self._kept += 1
            return old, now - slot.fetched_at
        if new.version > old.version:
            return self._store(key, new, now), 0.0
        if new.version < old.version:
            self._kept += 1
            return old, now - slot.fetched_at
        if newer_read:
            return self._store(key, self._merge(old, new), now), 0.0
        slot.value = self._merge(new, old)
        return slot.value, now - slot.fetched_at

    def _store(self, key: str, value: V, now: float) -> V:
        self._entries[key] = _Slot(value, now)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return value
