"""The per-kind index, the sweeper's tally and take_census(), against a real Redis server."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys

import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from jobpulse import Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS, evalsha
from jobpulse.metrics import take_census
from jobpulse.metrics.prometheus import render

from ..cli.support import ROOT, env
from ..support import eventually


async def seed(
    redis: aioredis.Redis, ns: str, ids: list[str], *, kind: str, ttl_ms: int, horizon_ms: int
) -> None:
    """Start ``ids`` as a worker's acquire does (acquire.lua, then the index writes), and never
    beat them: they go STALE when ``ttl_ms`` has passed."""
    schema = KeySchema(ns)
    pipe = redis.pipeline(transaction=False)
    for job in ids:
        args = [secrets.token_hex(8), ttl_ms, 100, "seed:1", "", "", "", kind]
        pipe.execute_command("EVALSHA", SCRIPTS.acquire.sha, 4, *schema.job(job).all(), *args)
    await redis.script_load(SCRIPTS.acquire.text)
    replies = await pipe.execute()
    pipe = redis.pipeline(transaction=False)
    for job, reply in zip(ids, replies, strict=True):
        now = int(reply[5])
        pipe.zadd(schema.index_for(job), {job: now + horizon_ms})
        pipe.zadd(schema.kind_index(kind), {job: now})
        pipe.zadd(schema.kinds(), {kind: now + horizon_ms})
    await pipe.execute()


async def test_a_worker_indexes_its_kind_at_start_and_removes_it_at_the_end(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    async with heartbeat(redis, "j1", namespace=ns, kind="report") as hb:
        started = await redis.hget(schema.state("j1"), "started_ms")
        assert await redis.zscore(schema.kind_index("report"), "j1") == float(started or 0)
        assert await redis.zscore(schema.kinds(), "report") is not None
        hb.progress.set(1)
    assert await redis.zcard(schema.kind_index("report")) == 0


async def test_census_counts_running_and_stale_jobs_per_kind_and_claims_once(
    redis: aioredis.Redis, ns: str
) -> None:
    await seed(redis, ns, ["dead1", "dead2"], kind="etl", ttl_ms=100, horizon_ms=100)
    opts = {"namespace": ns, "kind": "report", "interval": 0.2, "ttl": 2.0}
    async with (
        heartbeat(redis, "r1", **opts),
        heartbeat(redis, "r2", **opts),
        heartbeat(redis, "r3", **opts),
    ):

        async def both_stale() -> object:
            census = await take_census(redis, namespace=ns)
            return census if {k.kind: k.stale for k in census.kinds}.get("etl") == 2 else None

        census = await eventually(both_stale, within=5)
        by_kind = {k.kind: k for k in census.kinds}
        assert (by_kind["report"].running, by_kind["report"].stale) == (3, 0)
        assert (by_kind["etl"].running, by_kind["etl"].stale) == (0, 2)
        assert by_kind["etl"].claims == 0
        assert len(by_kind["report"].heartbeat_ages) == 3
        assert all(age < 2.0 for age in by_kind["report"].heartbeat_ages)
        assert by_kind["etl"].oldest_age is not None
        assert by_kind["etl"].oldest_age >= 0.1
        assert census.sweep_age is None
        assert census.truncated is False

        claimed = await Sweeper(redis, namespace=ns).sweep()
        assert sorted(job.job_id for job in claimed) == ["dead1", "dead2"]
        assert await Sweeper(redis, namespace=ns).sweep() == []
        census = await take_census(redis, namespace=ns)
        by_kind = {k.kind: k for k in census.kinds}
        assert (by_kind["etl"].running, by_kind["etl"].stale, by_kind["etl"].claims) == (0, 0, 2)
        assert by_kind["report"].running == 3
        assert census.sweep_age is not None
        assert census.sweep_age < 5
    assert await redis.zcard(KeySchema(ns).kind_index("etl")) == 0


async def test_tally_counts_a_replayed_claim_once(redis: aioredis.Redis, ns: str) -> None:
    schema = KeySchema(ns)
    keys = (schema.stats(), schema.claims_seen())
    for _ in range(2):  # a client retry replays the same call
        await evalsha(redis, SCRIPTS.tally, keys, ["etl", "job1 3", "etl", "job2 5"])
    await evalsha(redis, SCRIPTS.tally, keys, ["etl", "job1 4"])  # a later attempt's claim
    assert await redis.hget(schema.stats(), "claims:etl") == b"3"
    assert await redis.hget(schema.stats(), "sweep_ms") is not None


async def test_a_sweep_drops_the_kind_entry_of_a_job_that_ended_unseen(
    redis: aioredis.Redis, ns: str
) -> None:
    """A worker that died between its final write and its index cleanup leaves both entries;
    the sweep that meets the running entry drops the kind entry first."""
    schema = KeySchema(ns)
    await seed(redis, ns, ["gone"], kind="etl", ttl_ms=100, horizon_ms=100)
    await redis.delete(schema.state("gone"))  # its snapshot expired long ago
    await asyncio.sleep(0.15)
    assert await Sweeper(redis, namespace=ns).sweep() == []
    assert await redis.zcard(schema.kind_index("etl")) == 0
    assert await redis.zcard(schema.index(0)) == 0


async def test_a_sweep_spares_the_kind_entry_of_an_attempt_started_after_it_read_the_clock(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    from jobpulse._recovery.tally import forget_ops

    await redis.zadd(schema.kind_index("etl"), {"new": 2_000, "old": 999})
    pipe = redis.pipeline(transaction=False)
    for args, options in forget_ops(schema, [], ["new", "old"], ["etl"], now_ms=1_000):
        pipe.execute_command(*args, **options)
    await redis.script_load(SCRIPTS.unindex.text)
    await pipe.execute()
    assert await redis.zrange(schema.kind_index("etl"), 0, -1) == [b"new"]


async def test_census_cost_does_not_grow_with_the_number_of_jobs(
    redis: aioredis.Redis, ns: str
) -> None:
    costs = []
    for n in (30, 60):
        ids = [f"n{n}-{i}" for i in range(n - (30 if costs else 0))]
        await seed(redis, ns, ids, kind="k", ttl_ms=60_000, horizon_ms=60_000)
        census = await take_census(redis, namespace=ns, age_sample=5)
        assert [(k.kind, k.running) for k in census.kinds] == [("k", n)]
        costs.append((census.commands, census.round_trips))
    # TIME, kinds, stats; ZCARD + candidates per shard; ZCARD, oldest, sample per kind; 5 HMGET
    # of the sample; HMGET + PTTL of the 5 oldest
    assert costs == [(3 + 2 + 3 + 5 + 10, 3), (3 + 2 + 3 + 5 + 10, 3)]


async def test_census_says_when_a_cap_was_hit(redis: aioredis.Redis, ns: str) -> None:
    await seed(redis, ns, ["a1"], kind="a", ttl_ms=60_000, horizon_ms=60_000)
    await seed(redis, ns, ["b1"], kind="b", ttl_ms=60_000, horizon_ms=60_000)
    census = await take_census(redis, namespace=ns, max_kinds=1)
    assert census.truncated is True
    assert len(census.kinds) == 1


async def test_kind_index_sweep_and_census_on_a_single_redis_and_a_cluster(
    client: aioredis.Redis, ns: str
) -> None:
    """Every key lives in a slot of its own: the worker's pipeline, the sweeper's cleanup and the
    census's pipelines are split by slot on a cluster."""
    opts = {"namespace": ns, "interval": 0.2, "ttl": 3.0}
    async with heartbeat(client, "c1", kind="report", **opts), heartbeat(client, "c2", **opts):
        census = await take_census(client, namespace=ns)
        assert [(k.kind, k.running, k.stale) for k in census.kinds] == [
            ("", 1, 0),
            ("report", 1, 0),
        ]
        assert await Sweeper(client, namespace=ns).sweep() == []
    census = await take_census(client, namespace=ns)
    assert [(k.kind, k.running) for k in census.kinds] == [("", 0), ("report", 0)]
    assert census.sweep_age is not None


async def server_ms(redis: aioredis.Redis) -> int:
    secs, micros = await redis.time()
    return int(secs) * 1000 + int(micros) // 1000


async def test_census_reports_the_longest_standstill_of_a_live_job_per_kind(
    redis: aioredis.Redis, redis_url: str, ns: str
) -> None:
    """A worker process that beats but no longer advances is "alive but not advancing" for as
    long as its ``done`` stood still; an older STALE job and an advancing job do not count."""
    schema = KeySchema(ns)
    await seed(redis, ns, ["dead"], kind="etl", ttl_ms=100, horizon_ms=60_000)
    with subprocess.Popen(
        [sys.executable, "-m", "tests.cli.job_proc", redis_url, ns, "stuck", "2", "0", "hold",
         "etl"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(b"ready")
            async with heartbeat(redis, "moving", namespace=ns, kind="etl", interval=0.05) as hb:

                async def settled() -> bool:
                    done = await redis.hget(schema.state("stuck"), "done")
                    return done == b"2" and await redis.pttl(schema.alive("dead")) == -2

                await eventually(settled)
                stuck_ms = int(await redis.hget(schema.state("stuck"), "progress_ms") or 0)
                await eventually(lambda: _later(redis, stuck_ms + 300))
                for i in range(3):  # the moving job advances on every beat
                    hb.progress.set(i + 1)
                    await asyncio.sleep(0.06)
                before = await server_ms(redis)
                census = await take_census(redis, namespace=ns)
                after = await server_ms(redis)
                assert await redis.hget(schema.state("stuck"), "status") == b"RUNNING"
                assert await redis.pttl(schema.alive("stuck")) > 0
        finally:
            proc.kill()
            proc.wait()
    etl = {k.kind: k for k in census.kinds}["etl"]
    assert etl.not_advancing_age is not None
    assert (before - stuck_ms) / 1000 <= etl.not_advancing_age <= (after - stuck_ms) / 1000
    exported = {
        (s.name, tuple(s.labels.items())): s.value
        for f in text_string_to_metric_families(render(census, None).decode())
        for s in f.samples
    }
    assert exported[("jobpulse_not_advancing_age_seconds", (("kind", "etl"),))] == (
        etl.not_advancing_age
    )


async def _later(redis: aioredis.Redis, at_ms: int) -> bool:
    return await server_ms(redis) >= at_ms


async def test_census_has_no_standstill_for_a_kind_whose_only_job_is_stale(
    redis: aioredis.Redis, ns: str
) -> None:
    schema = KeySchema(ns)
    await seed(redis, ns, ["dead"], kind="etl", ttl_ms=100, horizon_ms=60_000)
    await eventually(lambda: _gone(redis, schema.alive("dead")))
    census = await take_census(redis, namespace=ns)
    assert [(k.kind, k.not_advancing_age) for k in census.kinds] == [("etl", None)]


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return bool(await redis.pttl(key) == -2)
