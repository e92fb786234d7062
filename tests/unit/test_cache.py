"""SnapshotCache: single flight, TTL, LRU cap and the (fence, seq) guard (no Redis).

The fetch functions here are plain coroutines gated by events, so each test decides exactly
when a "reply" arrives; time is an injected clock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest

from jobpulse._reader.cache import SnapshotCache


@dataclass(frozen=True)
class Snap:
    version: tuple[int, int]
    server_ms: int
    fields: frozenset[str] = frozenset({"status", "seq"})
    exists: bool = True
    terminal: bool = False
    values: dict[str, int] = field(default_factory=dict, compare=False)


def merge(older: Snap, newer: Snap) -> Snap:
    return replace(
        newer, fields=older.fields | newer.fields, values={**older.values, **newer.values}
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    ttl: float = 0.5, terminal_ttl: float = 5.0, max_entries: int = 100
) -> tuple[SnapshotCache[Snap], Clock]:
    clock = Clock()
    return SnapshotCache(
        ttl=ttl, terminal_ttl=terminal_ttl, max_entries=max_entries, merge=merge, clock=clock
    ), clock


F = frozenset({"status", "seq"})


async def test_concurrent_misses_share_one_fetch() -> None:
    cache, _ = make()
    calls = 0
    gate = asyncio.Event()

    async def fetch(fields: frozenset[str]) -> Snap:
        nonlocal calls
        calls += 1
        await gate.wait()
        return Snap((1, 5), 1000)

    waiters = [asyncio.create_task(cache.get("job", F, fetch)) for _ in range(1000)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiters)
    assert calls == 1
    assert {r[0].version for r in results} == {(1, 5)}
    stats = cache.statistics()
    assert (stats.fetches, stats.joined) == (1, 999)


async def test_hits_within_ttl_and_refetch_after() -> None:
    cache, clock = make(ttl=0.5)
    calls = 0

    async def fetch(fields: frozenset[str]) -> Snap:
        nonlocal calls
        calls += 1
        return Snap((1, calls), 1000 + calls)

    assert (await cache.get("job", F, fetch))[0].version == (1, 1)
    clock.now += 0.3
    snap, age = await cache.get("job", F, fetch)
    assert snap.version == (1, 1)
    assert age == pytest.approx(0.3)
    clock.now += 0.3
    assert (await cache.get("job", F, fetch))[0].version == (1, 2)
    assert calls == 2


async def test_terminal_entries_live_terminal_ttl() -> None:
    cache, clock = make(ttl=0.5, terminal_ttl=5.0)
    calls = 0

    async def fetch(fields: frozenset[str]) -> Snap:
        nonlocal calls
        calls += 1
        return Snap((1, 9), 1000, terminal=True)

    await cache.get("job", F, fetch)
    clock.now += 4.0
    await cache.get("job", F, fetch)
    assert calls == 1
    clock.now += 1.5
    await cache.get("job", F, fetch)
    assert calls == 2


async def test_ttl_zero_disables_hits_and_joining() -> None:
    cache, _ = make(ttl=0.0, terminal_ttl=0.0)
    calls = 0
    gate = asyncio.Event()

    async def fetch(fields: frozenset[str]) -> Snap:
        nonlocal calls
        calls += 1
        await gate.wait()
        return Snap((1, 1), 1000)

    waiters = [asyncio.create_task(cache.get("job", F, fetch)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*waiters)
    await cache.get("job", F, fetch)
    assert calls == 6


async def test_lru_is_capped_and_evicts_least_recently_used() -> None:
    cache, _ = make(max_entries=3)

    async def fetch(fields: frozenset[str]) -> Snap:
        return Snap((1, 1), 1000)

    for key in "abc":
        await cache.get(key, F, fetch)
    await cache.get("a", F, fetch)  # a is now the most recent
    await cache.get("d", F, fetch)
    assert len(cache) == 3
    assert cache.peek("b") is None
    assert cache.peek("a") is not None
    assert cache.peek("d") is not None


async def test_never_hands_out_an_older_version() -> None:
    cache, _ = make(ttl=0.0, terminal_ttl=0.0)
    replies = iter(
        [Snap((2, 10), 1000), Snap((2, 4), 1001), Snap((1, 50), 1002), Snap((3, 1), 1003)]
    )

    async def fetch(fields: frozenset[str]) -> Snap:
        return next(replies)

    seen = [(await cache.get("job", F, fetch))[0].version for _ in range(4)]
    assert seen == [(2, 10), (2, 10), (2, 10), (3, 1)]
    assert cache.statistics().kept_newer == 2


async def test_racing_replies_resolved_out_of_order() -> None:
    cache, _ = make(ttl=0.0, terminal_ttl=0.0)
    gates = [asyncio.Event(), asyncio.Event()]
    versions = iter([(1, 1), (1, 2)])
    order = iter([0, 1])

    async def fetch(fields: frozenset[str]) -> Snap:
        v, g = next(versions), gates[next(order)]
        await g.wait()
        return Snap(v, 1000 + v[1])

    first = asyncio.create_task(cache.get("job", F, fetch))
    second = asyncio.create_task(cache.get("job", F, fetch))
    await asyncio.sleep(0)
    gates[1].set()  # the newer read answers first
    assert (await second)[0].version == (1, 2)
    gates[0].set()
    assert (await first)[0].version == (1, 2)  # the late, older reply is not handed out


async def test_gone_snapshot_resets_the_guard_only_when_read_later() -> None:
    cache, _ = make(ttl=0.0, terminal_ttl=0.0)
    replies = iter([
        Snap((5, 5), 2000),
        Snap((0, 0), 1500, exists=False),  # a late reply from before the job existed
        Snap((0, 0), 2500, exists=False),  # read later: the snapshot expired
        Snap((1, 1), 2600),  # the job id started again from fence 1
    ])  # fmt: skip

    async def fetch(fields: frozenset[str]) -> Snap:
        return next(replies)

    seen = [(await cache.get("job", F, fetch))[0] for _ in range(4)]
    assert [s.exists for s in seen] == [True, True, False, True]
    assert [s.version for s in seen] == [(5, 5), (5, 5), (0, 0), (1, 1)]


async def test_field_subsets() -> None:
    cache, _ = make()
    asked: list[frozenset[str]] = []

    async def fetch(fields: frozenset[str]) -> Snap:
        asked.append(fields)
        return Snap((1, 1), 1000 + len(asked), fields=fields, values=dict.fromkeys(fields, 1))

    small = frozenset({"status", "done"})
    big = frozenset({"status", "done", "meta"})
    await cache.get("job", small, fetch)
    await cache.get("job", small, fetch)  # hit
    snap, _ = await cache.get("job", big, fetch)  # not covered: fetched, merged (same version)
    assert asked == [small, big]
    assert snap.fields == big
    await cache.get("job", frozenset({"meta"}), fetch)  # covered now
    assert len(asked) == 2


async def test_failed_fetch_reaches_every_joiner_and_caches_nothing() -> None:
    cache, _ = make()
    gate = asyncio.Event()
    fail = True

    async def fetch(fields: frozenset[str]) -> Snap:
        await gate.wait()
        if fail:
            raise ConnectionError("down")
        return Snap((1, 1), 1000)

    waiters = [asyncio.create_task(cache.get("job", F, fetch)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert len(cache) == 0
    fail = False
    assert (await cache.get("job", F, fetch))[0].version == (1, 1)


async def test_cancelling_the_first_caller_hands_the_fetch_to_the_joiners() -> None:
    cache, _ = make()
    gate = asyncio.Event()
    calls = 0

    async def fetch(fields: frozenset[str]) -> Snap:
        nonlocal calls
        calls += 1
        await gate.wait()
        return Snap((1, 1), 1000)

    first = asyncio.create_task(cache.get("job", F, fetch))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.get("job", F, fetch))
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert (await second)[0].version == (1, 1)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert calls == 2  # the first caller's own fetch died with it; a task fetched again


async def test_a_cancelled_lone_caller_leaves_nothing_in_flight() -> None:
    cache, _ = make()
    gate = asyncio.Event()

    async def fetch(fields: frozenset[str]) -> Snap:
        await gate.wait()
        return Snap((1, 1), 1000)

    task = asyncio.create_task(cache.get("job", F, fetch))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    assert (await cache.get("job", F, fetch))[0].version == (1, 1)
    assert cache.statistics().joined == 0
