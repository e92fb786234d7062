"""A census of the running jobs by kind, read from Redis at a bounded cost.

Three pipelined round trips, whatever the number of jobs:

1. ``TIME`` (beside the pipeline, at the same time); the kinds (``ZREVRANGE ns:{#kinds}``, at
   most ``max_kinds``); the sweepers' counters (``HGETALL ns:{#stats}``: one field per kind
   ever claimed, plus ``sweep_ms``).
2. Per index shard: ``ZCARD`` and the stale candidates (``ZRANGE … BYSCORE -inf now``, at most
   ``max_stale``). Per kind: ``ZCARD`` (running + stale), the ``age_sample + 1`` oldest entries
   (``ZRANGE 0 age_sample WITHSCORES``), and a random sample of ``age_sample`` members
   (``ZRANDMEMBER``).
3. Per candidate: ``HMGET status kind`` and ``PTTL alive``; per sampled member:
   ``HMGET status heartbeat_ms progress_ms``; per one of the ``age_sample`` oldest members:
   ``HMGET status progress_ms`` and ``PTTL alive``.

So a census costs ``3 + 2·shards + 3·kinds + 2·candidates + sampled + 2·oldest`` commands, at
most ``3 + 2·shards + kinds·(3 + 3·age_sample) + 2·max_stale`` — it does not grow with the
number of jobs.

"Not advancing" (:attr:`KindCensus.not_advancing_age`) is read from the oldest attempts of
each kind, not from the random sample, because a job cannot have stood still for longer than
it has run (``progress_ms >= started_ms``, and the per-kind index is scored by ``started_ms``):
the longest standstill among the ``age_sample`` oldest live attempts is the kind's longest when
the kind has no more attempts than that, or when it is at least the age of the next-oldest
attempt (which bounds every younger one). A body that deadlocks early is among the oldest
attempts of its kind soon after.

STALE is counted among the candidates (jobs past their index deadline, as the sweeper sees
them): a dead worker's job shows up as STALE at most ``index_horizon`` after its death, and
until a sweeper claims it. When a cap was hit, :attr:`Census.truncated` says so.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from .._protocol.codec import to_text
from .._protocol.keys import KeySchema, check_job_id
from ..errors import InvalidJobId

__all__ = ["Census", "KindCensus", "quantiles", "take_census"]


@dataclass(frozen=True, slots=True)
class KindCensus:
    """The running jobs of one kind.

    Attributes:
        kind: the kind (``""`` for jobs started without one).
        running: RUNNING jobs (indexed jobs of the kind minus the STALE ones).
        stale: STALE jobs found among the candidates.
        oldest_age: seconds since the oldest RUNNING or STALE attempt of the kind started, or
            None when there is none.
        heartbeat_ages: seconds since the last beat, of a random sample of the kind's jobs.
        progress_ages: seconds since ``done`` last changed, of the same sample.
        not_advancing_age: the longest time, in seconds, that ``done`` has stood still in a
            RUNNING job of the kind whose worker is alive (beating), read from the kind's
            ``age_sample`` oldest attempts (see the module doc for when that is the longest of
            all); None when none of them is RUNNING and alive.
        claims: jobs of the kind claimed by sweepers so far (counted in Redis).
    """

    kind: str
    running: int = 0
    stale: int = 0
    oldest_age: float | None = None
    heartbeat_ages: tuple[float, ...] = ()
    progress_ages: tuple[float, ...] = ()
    not_advancing_age: float | None = None
    claims: int = 0


@dataclass(frozen=True, slots=True)
class Census:
    """What :func:`take_census` read.

    Attributes:
        kinds: one entry per kind, sorted by kind.
        indexed: entries of the running-jobs index (RUNNING and STALE jobs, and jobs that just
            ended).
        candidates: index entries past their deadline (what the next sweep examines).
        sweep_age: seconds since a sweeper last swept this namespace, or None if never.
        truncated: a cap (``max_kinds``, ``max_stale``) was hit; counts are then lower bounds.
        commands: Redis commands the census sent.
        round_trips: round trips it took (3; 2 when there was nothing to examine).
    """

    kinds: tuple[KindCensus, ...] = ()
    indexed: int = 0
    candidates: int = 0
    sweep_age: float | None = None
    truncated: bool = False
    commands: int = 0
    round_trips: int = 0


def quantiles(values: tuple[float, ...]) -> dict[str, float]:
    """``{"0.5": .., "0.9": .., "0.99": .., "1": ..}`` of ``values`` (empty for none)."""
    if not values:
        return {}
    ordered = sorted(values)
    if len(ordered) == 1:
        return dict.fromkeys(("0.5", "0.9", "0.99", "1"), ordered[0])
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"0.5": cuts[49], "0.9": cuts[89], "0.99": cuts[98], "1": ordered[-1]}


async def take_census(
    redis: Any,
    *,
    namespace: str = "jobpulse",
    index_shards: int = 1,
    max_kinds: int = 50,
    max_stale: int = 500,
    age_sample: int = 20,
) -> Census:
    """Count the running and stale jobs per kind, in three round trips (see the module doc).

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        namespace: the jobs' namespace.
        index_shards: the workers' ``index_shards``.
        max_kinds: most kinds read (the most recently active ones first; >= 1).
        max_stale: most stale candidates examined (>= 1).
        age_sample: jobs sampled per kind for the age quantiles, and oldest jobs read per kind
            for the longest standstill (>= 1).

    Returns:
        The :class:`Census`.

    Raises:
        ValueError: a cap is out of range.
        InvalidJobId: the namespace is invalid.
    """
    for name, value in (("max_kinds", max_kinds), ("max_stale", max_stale)):
        _check_cap(name, value, 10_000)
    _check_cap("age_sample", age_sample, 1000)
    schema = KeySchema(namespace, index_shards)
    shards = schema.indexes()

    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrevrange(schema.kinds(), 0, max_kinds)
        pipe.hgetall(schema.stats())
        # TIME beside the pipeline, at the same time (a cluster pipeline refuses keyless TIME)
        (secs, micros), (raw_kinds, raw_stats) = await asyncio.gather(redis.time(), pipe.execute())
    now_ms = int(secs) * 1000 + int(micros) // 1000
    kinds = [to_text(k) or "" for k in raw_kinds]
    truncated = len(kinds) > max_kinds
    kinds = kinds[:max_kinds]
    stats = {to_text(k) or "": to_text(v) or "" for k, v in raw_stats.items()}
    commands = 3

    async with redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.zcard(shard)
            pipe.zrange(shard, "-inf", now_ms, byscore=True, offset=0, num=max_stale + 1)
        for kind in kinds:
            key = schema.kind_index(kind)
            pipe.zcard(key)
            pipe.zrange(key, 0, age_sample, withscores=True)
            pipe.zrandmember(key, age_sample)
        second = await pipe.execute()
    commands += len(second)
    indexed = sum(int(n) for n in second[0 : 2 * len(shards) : 2])
    candidates: list[str] = []
    for reply in second[1 : 2 * len(shards) : 2]:
        candidates += [to_text(m) or "" for m in reply]
    truncated |= len(candidates) > max_stale
    candidates = [m for m in candidates[:max_stale] if _valid(m)]
    per_kind = second[2 * len(shards) :]
    sizes = {k: int(per_kind[3 * i]) for i, k in enumerate(kinds)}
    oldest = {k: per_kind[3 * i + 1] for i, k in enumerate(kinds)}
    # the oldest attempts of each kind: where the longest standstill is (see the module doc)
    elders = [
        (k, job)
        for k in kinds
        for job in (to_text(m) or "" for m, _ in oldest[k][:age_sample])
        if _valid(job)
    ]
    samples = {
        k: [to_text(m) or "" for m in per_kind[3 * i + 2] or []] for i, k in enumerate(kinds)
    }

    async with redis.pipeline(transaction=False) as pipe:
        for job in candidates:
            keys = schema.job(job)
            pipe.hmget(keys.state, "status", "kind")
            pipe.pttl(keys.alive)
        sampled = [(k, job) for k, jobs in samples.items() for job in jobs if _valid(job)]
        for _, job in sampled:
            pipe.hmget(schema.state(job), "status", "heartbeat_ms", "progress_ms")
        for _, job in elders:
            keys = schema.job(job)
            pipe.hmget(keys.state, "status", "progress_ms")
            pipe.pttl(keys.alive)
        third = await pipe.execute() if candidates or sampled or elders else []
    commands += len(third)

    stale: dict[str, int] = {}
    for i in range(len(candidates)):
        (status, kind), pttl = third[2 * i], third[2 * i + 1]
        if to_text(status) == "RUNNING" and int(pttl) == -2:
            stale[to_text(kind) or ""] = stale.get(to_text(kind) or "", 0) + 1
    hb_ages: dict[str, list[float]] = {}
    progress_ages: dict[str, list[float]] = {}
    at = 2 * len(candidates) + len(sampled)
    for (kind, _), (status, hb, progress) in zip(
        sampled, third[2 * len(candidates) : at], strict=True
    ):
        if to_text(status) != "RUNNING":
            continue
        if hb is not None:
            hb_ages.setdefault(kind, []).append(max(0.0, (now_ms - int(hb)) / 1000))
        if progress is not None:
            progress_ages.setdefault(kind, []).append(max(0.0, (now_ms - int(progress)) / 1000))
    standstill: dict[str, float] = {}
    for i, (kind, _) in enumerate(elders):
        (status, progress), pttl = third[at + 2 * i], third[at + 2 * i + 1]
        if to_text(status) != "RUNNING" or int(pttl) == -2 or progress is None:
            continue  # ended, or STALE (counted as such): not "alive but not advancing"
        age = max(0.0, (now_ms - int(progress)) / 1000)
        standstill[kind] = max(age, standstill.get(kind, 0.0))

    out = []
    for kind in sorted(set(kinds) | set(stale)):
        first = oldest.get(kind)
        out.append(
            KindCensus(
                kind=kind,
                running=max(0, sizes.get(kind, 0) - stale.get(kind, 0)),
                stale=stale.get(kind, 0),
                oldest_age=max(0.0, (now_ms - float(first[0][1])) / 1000) if first else None,
                heartbeat_ages=tuple(hb_ages.get(kind, ())),
                progress_ages=tuple(progress_ages.get(kind, ())),
                not_advancing_age=standstill.get(kind),
                claims=int(stats.get(f"claims:{kind}", 0) or 0),
            )
        )
    sweep_ms = stats.get("sweep_ms")
    return Census(
        kinds=tuple(out),
        indexed=indexed,
        candidates=len(candidates),
        sweep_age=None if not sweep_ms else max(0.0, (now_ms - int(sweep_ms)) / 1000),
        truncated=truncated,
        commands=commands,
        round_trips=3 if third else 2,
    )


def _valid(job_id: str) -> bool:
    try:
        check_job_id(job_id)
    except InvalidJobId:
        return False
    return True


def _check_cap(name: str, value: object, top: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise ValueError(f"{name} must be an int in 1..{top}, got {value!r}")
