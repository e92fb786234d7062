"""Every script is safe to replay: a fault proxy forwards a command to Redis, then cuts the
connection before the reply, and redis-py's default retry sends it again. The outcome must be
the one a single call gives. On a single server and on the 3-master cluster (one proxy per
node, the cluster client's ``address_remap`` sending it through them).

Also: an acquire whose reply is late (the client gives up after ``ttl``) leaves nothing, or a
job the sweeper finds, and says which.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import jobpulse.sync
from jobpulse import (
    JobCancelled,
    JobState,
    StatusReader,
    Sweeper,
    heartbeat,
    request_cancel,
)
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse._provision import LocalCluster, RedisServer
from jobpulse._worker.thread_ticker import ThreadTicker
from jobpulse._worker.ticker import Ticker

from ..support import eventually
from .proxy import FaultProxy

AnyRedis = aioredis.Redis | RedisCluster


@dataclass
class Replayed:
    client: AnyRedis  # through the proxies: what the code under test uses
    direct: AnyRedis  # what the test looks through
    arm: Callable[[bytes, str, float | None], threading.Event]
    """arm(marker, job_key, delay): the next command holding ``marker`` sent to the node of
    ``job_key`` gets its reply dropped (delay None) or held ``delay`` seconds."""
    hold: Callable[[bytes, str], threading.Event]
    """hold(marker, job_key): as arm with delay None, and every byte from then on is held
    (the client's retry too) until ``lift()``."""
    lift: Callable[[], None]


async def _load_scripts(*urls: str) -> None:
    """Load every script on every node first: a NOSCRIPT reply would be the one dropped."""
    for url in urls:
        node = aioredis.Redis.from_url(url)
        try:
            for field in dataclasses.fields(SCRIPTS):
                await node.script_load(getattr(SCRIPTS, field.name).text)
        finally:
            await node.aclose()


@pytest.fixture(params=["single", "cluster"])
async def replayed(request: pytest.FixtureRequest, ns: str) -> AsyncIterator[Replayed]:
    with ExitStack() as stack:
        if request.param == "single":
            server = stack.enter_context(RedisServer())
            proxy = stack.enter_context(FaultProxy(server.port))
            # The constructor's defaults (from_url sets no retry): 3 retries on ConnectionError.
            client: AnyRedis = aioredis.Redis(host="127.0.0.1", port=proxy.port)
            direct: AnyRedis = aioredis.Redis.from_url(server.url)
            await _load_scripts(server.url)

            def arm(marker: bytes, key: str, delay: float | None) -> threading.Event:
                if delay is None:
                    return proxy.drop_reply_once(marker)
                return proxy.delay_reply_once(marker, delay)

            def hold(marker: bytes, key: str) -> threading.Event:
                return proxy.drop_reply_once(marker, hold=True)

            def lift() -> None:
                proxy.blackhole = False

        else:
            cluster: LocalCluster = request.getfixturevalue("redis_cluster")
            proxies = {p: stack.enter_context(FaultProxy(p)) for p in cluster.ports}

            def remap(address: tuple[str, int]) -> tuple[str, int]:
                _host, port = address
                return ("127.0.0.1", proxies[port].port) if port in proxies else address

            first = proxies[cluster.ports[0]]
            client = RedisCluster.from_url(first.url, address_remap=remap)
            await client.initialize()
            direct = RedisCluster.from_url(cluster.url)
            await direct.initialize()
            await _load_scripts(*(f"redis://127.0.0.1:{p}/0" for p in cluster.ports))

            def arm(marker: bytes, key: str, delay: float | None) -> threading.Event:
                node = direct.get_node_from_key(key)  # type: ignore[union-attr]
                proxy = proxies[node.port]
                if delay is None:
                    return proxy.drop_reply_once(marker)
                return proxy.delay_reply_once(marker, delay)

            def hold(marker: bytes, key: str) -> threading.Event:
                node = direct.get_node_from_key(key)  # type: ignore[union-attr]
                return proxies[node.port].drop_reply_once(marker, hold=True)

            def lift() -> None:
                for proxy in proxies.values():
                    proxy.blackhole = False

        try:
            yield Replayed(client, direct, arm, hold, lift)
        finally:
            await client.aclose()
            keys = [k async for k in direct.scan_iter(match=f"{ns}:*", count=1000)]
            for key in keys:
                await direct.delete(key)
            await direct.aclose()


async def _kinds(direct: AnyRedis, events: str) -> list[bytes]:
    return [e[1][b"kind"] for e in await direct.xrange(events) if e[1][b"kind"] != b"beat"]


async def test_acquire_and_finish_replayed_give_the_same_outcome(
    replayed: Replayed, ns: str
) -> None:
    client, direct = replayed.client, replayed.direct
    keys = KeySchema(ns).job("replay")
    lost_acquire = replayed.arm(SCRIPTS.acquire.sha.encode(), keys.state, None)
    async with heartbeat(client, "replay", namespace=ns, interval=30, ttl=60) as hb:
        assert lost_acquire.is_set()  # the first acquire ran; its reply was lost
        assert hb.attempt == 1  # the retry answered the same attempt (not JobBusy)
        assert int(await direct.hget(keys.state, "fence")) == hb.fence
        lost_finish = replayed.arm(SCRIPTS.finish.sha.encode(), keys.state, None)
    assert lost_finish.is_set()  # no StateNotWritten: the retry found its own final write
    assert await _kinds(direct, keys.events) == [b"start", b"end"]
    assert await direct.hget(keys.state, "status") == b"COMPLETED"
    assert await direct.hget(keys.state, "attempt") == b"1"


async def test_a_checkpoint_beat_whose_reply_was_lost_is_recorded_once(
    replayed: Replayed, ns: str
) -> None:
    """A single server's client retries the packed write itself (a replay of the same beat); on
    a cluster jobpulse sends the beat the pipeline handed back with a connection error again
    through the cluster client's retry (``_protocol/cluster.py``). Either way beat.lua answers
    the second send as a replay, and no beat failed."""
    client, direct = replayed.client, replayed.direct
    keys = KeySchema(ns).job("beat")
    async with heartbeat(client, "beat", namespace=ns, interval=30, ttl=60) as hb:
        single = isinstance(client, aioredis.Redis)
        assert Ticker.for_client(client, time.monotonic).packed is single  # else a Pipeline
        lost_beat = replayed.arm(SCRIPTS.beat.sha.encode(), keys.state, None)
        await hb.checkpoint(step=1)
        assert lost_beat.is_set()
        # the client's retry answered "written": the same beat, replayed
        assert hb.statistics().beats_failed == 0
    assert await _kinds(direct, keys.events) == [b"start", b"checkpoint", b"end"]


def test_a_sync_checkpoint_beat_whose_reply_was_lost_is_recorded_once(ns: str) -> None:
    """The thread ticker's packed write on a plain client: the connection's retry sends the
    whole write again (the beat under the same seq), and beat.lua answers it as a replay."""
    with RedisServer() as server, FaultProxy(server.port) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        direct = redis.Redis.from_url(server.url)
        try:
            direct.script_load(SCRIPTS.beat.text)  # a NOSCRIPT reply would be the one dropped
            keys = KeySchema(ns).job("beat")
            with jobpulse.sync.heartbeat(
                client, "beat", namespace=ns, interval=30, ttl=60, sidecar=False
            ) as hb:
                assert ThreadTicker.for_client(client, time.monotonic).packed  # not a Pipeline
                lost_beat = proxy.drop_reply_once(SCRIPTS.beat.sha.encode())
                assert hb.checkpoint(step=1)
                assert lost_beat.is_set()
                assert hb.statistics().beats_failed == 0  # the client's own retry answered
            kinds = [e[1][b"kind"] for e in direct.xrange(keys.events)]
            assert [k for k in kinds if k != b"beat"] == [b"start", b"checkpoint", b"end"]
        finally:
            client.close()
            direct.close()


async def test_a_beat_that_finds_the_data_lost_and_whose_reply_was_lost_still_repairs(
    replayed: Replayed, ns: str
) -> None:
    """The beat that finds the job's keys gone (a restart that lost the data) is replayed by the
    client (its reply lost): the replay answers as the first run did ("resend everything"), so
    the static fields, the checkpoint and the running-index entry come back. The replay used
    to answer "written" and they stayed missing for the whole run (issue 24, item 1)."""
    client, direct = replayed.client, replayed.direct
    schema = KeySchema(ns)
    keys = schema.job("lossy")
    index = schema.index_for("lossy")
    async with heartbeat(
        client, "lossy", namespace=ns, interval=30, ttl=60, kind="etl", meta={"k": 1}
    ) as hb:
        await hb.checkpoint(row=10)
        await direct.delete(*keys.all())  # the job's keys and its index entry are lost
        await direct.zrem(index, "lossy")
        lost_beat = replayed.arm(SCRIPTS.beat.sha.encode(), keys.state, None)
        await hb.checkpoint(row=20)
        assert lost_beat.is_set()
        state = await direct.hgetall(keys.state)
        assert state[b"status"] == b"RUNNING"
        assert (state[b"kind"], state[b"meta"], state[b"attempt"]) == (b"etl", b'{"k":1}', b"1")
        assert b"worker" in state
        assert b"started_ms" in state
        assert state[b"checkpoint"] == b'{"row":20}'
        assert await direct.zscore(index, "lossy") is not None
    assert await _kinds(direct, keys.events) == [b"checkpoint", b"end"]  # row 20 once


def test_a_sync_beat_that_finds_the_data_lost_and_whose_reply_was_lost_still_repairs(
    ns: str,
) -> None:
    """The thread shell: the connection's retry replays the packed write whose beat found the
    job's keys gone; the replay answers "resend everything" as the first run did."""
    with RedisServer() as server, FaultProxy(server.port) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        direct = redis.Redis.from_url(server.url)
        try:
            direct.script_load(SCRIPTS.beat.text)  # a NOSCRIPT reply would be the one dropped
            schema = KeySchema(ns)
            keys = schema.job("lossy")
            with jobpulse.sync.heartbeat(
                client, "lossy", namespace=ns, interval=30, ttl=60, kind="etl", sidecar=False
            ) as hb:
                assert hb.checkpoint(row=10)
                direct.delete(*keys.all())
                direct.zrem(schema.index_for("lossy"), "lossy")
                lost_beat = proxy.drop_reply_once(SCRIPTS.beat.sha.encode())
                assert hb.checkpoint(row=20)
                assert lost_beat.is_set()
                state = direct.hgetall(keys.state)
                assert (state[b"kind"], state[b"attempt"]) == (b"etl", b"1")
                assert state[b"checkpoint"] == b'{"row":20}'
                assert direct.zscore(schema.index_for("lossy"), "lossy") is not None
            kinds = [e[1][b"kind"] for e in direct.xrange(keys.events)]
            assert [k for k in kinds if k != b"beat"] == [b"checkpoint", b"end"]
        finally:
            client.close()
            direct.close()


async def test_a_final_write_retried_after_a_new_attempt_started_reports_it_written(
    replayed: Replayed, ns: str
) -> None:
    """The final write ran, its reply was lost, and the job id was started again before the
    client's retry landed: the retry answers "already ended" (the end entry of our fence is in
    the stream), so the worker does not raise LeaseLost for a job it completed (issue 24,
    item 3). The new attempt is untouched."""
    client, direct = replayed.client, replayed.direct
    keys = KeySchema(ns).job("again")

    async def first_attempt() -> int:
        async with heartbeat(client, "again", namespace=ns, interval=30, ttl=60) as hb:
            return hb.fence

    lost_finish = replayed.hold(SCRIPTS.finish.sha.encode(), keys.state)
    first = asyncio.create_task(first_attempt())
    try:
        await eventually(lambda: _is_set(lost_finish))  # it ran; the retry is held
        async with heartbeat(direct, "again", namespace=ns, interval=30, ttl=60) as hb:
            assert hb.attempt == 2
            replayed.lift()  # the retry lands now, under the new attempt's lease
            fence = await first  # no LeaseLost
            assert await direct.hget(keys.state, "status") == b"RUNNING"
            assert int(await direct.hget(keys.state, "fence")) == hb.fence > fence
    finally:
        replayed.lift()
        first.cancel()
    ends = [e[1] for e in await direct.xrange(keys.events) if e[1][b"kind"] == b"end"]
    assert [(e[b"status"], int(e[b"fence"])) for e in ends] == [
        (b"COMPLETED", fence),
        (b"COMPLETED", hb.fence),
    ]


async def _is_set(event: threading.Event) -> bool:
    return event.is_set()


async def test_cancel_replayed_gives_the_same_outcome(replayed: Replayed, ns: str) -> None:
    client, direct = replayed.client, replayed.direct
    keys = KeySchema(ns).job("cancel")
    with pytest.raises(JobCancelled):
        async with heartbeat(client, "cancel", namespace=ns, interval=0.1, ttl=5):
            lost = replayed.arm(SCRIPTS.cancel.sha.encode(), keys.state, None)
            assert await request_cancel(client, "cancel", namespace=ns) is True
            assert lost.is_set()
            await eventually(lambda: _never(), within=10)
    assert await _kinds(direct, keys.events) == [b"start", b"cancel", b"end"]
    assert await direct.hget(keys.state, "status") == b"CANCELLED"


async def _never() -> bool:
    return False


async def test_claim_and_ack_replayed_give_the_same_outcome(replayed: Replayed, ns: str) -> None:
    client, direct = replayed.client, replayed.direct
    schema = KeySchema(ns)
    keys = schema.job("stale")
    seconds, _ = await direct.time()
    await direct.hset(keys.state, mapping={"status": "RUNNING", "seq": 3, "fence": 7, "attempt": 1})
    await direct.set(keys.fence, 7)
    await direct.zadd(schema.index_for("stale"), {"stale": (seconds - 10) * 1000})
    sweeper = Sweeper(client, namespace=ns)
    lost_claim = replayed.arm(SCRIPTS.claim.sha.encode(), keys.state, None)
    (job,) = await sweeper.sweep()
    assert lost_claim.is_set()
    assert (job.job_id, job.attempt, job.fence) == ("stale", 1, 8)  # claimed once
    assert await direct.get(keys.fence) == b"8"
    assert await _kinds(direct, keys.events) == [b"stale"]
    lost_ack = replayed.arm(SCRIPTS.ack.sha.encode(), keys.state, None)
    assert await sweeper.ack(job) is True
    assert lost_ack.is_set()
    assert await direct.hget(keys.state, "claim") is None


async def test_many_jobs_entered_at_once_on_a_fresh_client_none_busy(
    replayed: Replayed, ns: str
) -> None:
    """Twelve jobs entered together (the issue saw 2 JobBusy on a fresh RedisCluster): with
    the first acquire's reply lost on top, every job starts, each once."""
    import asyncio

    client, direct = replayed.client, replayed.direct
    replayed.arm(SCRIPTS.acquire.sha.encode(), KeySchema(ns).state("m0"), None)

    async def one(i: int) -> int:
        async with heartbeat(client, f"m{i}", namespace=ns, interval=30, ttl=60) as hb:
            return hb.attempt

    assert await asyncio.gather(*(one(i) for i in range(12))) == [1] * 12
    for i in range(12):
        assert await _kinds(direct, KeySchema(ns).events(f"m{i}")) == [b"start", b"end"]


# -- a late acquire leaves nothing, or a findable job -----------------------------------------


async def test_an_acquire_whose_reply_is_late_leaves_a_job_the_sweeper_finds(
    replayed: Replayed, ns: str
) -> None:
    client, direct = replayed.client, replayed.direct
    keys = KeySchema(ns).job("late")
    replayed.arm(SCRIPTS.acquire.sha.encode(), keys.state, 1.0)
    with pytest.raises(TimeoutError, match=r"'late'.*acquire its lease.*sweeper marks it LOST"):
        async with heartbeat(client, "late", namespace=ns, interval=0.05, ttl=0.3):
            pytest.fail("the body must not run")
    assert await direct.hget(keys.state, "status") == b"RUNNING"  # Redis ran it
    sweeper = Sweeper(direct, namespace=ns)
    (job,) = await eventually(sweeper.sweep, within=10)  # findable: it was indexed first
    assert (job.job_id, job.attempt) == ("late", 1)
    reader = StatusReader(direct, namespace=ns, cache_ttl=0)
    try:
        assert (await reader.get("late")).state is JobState.LOST
    finally:
        await reader.aclose()


async def test_an_index_write_whose_reply_is_late_leaves_nothing_running(
    replayed: Replayed, ns: str
) -> None:
    client, direct = replayed.client, replayed.direct
    schema = KeySchema(ns)
    replayed.arm(SCRIPTS.enroll.sha.encode(), schema.index_for("early"), 1.0)
    with pytest.raises(TimeoutError, match=r"'early'.*index the job; nothing is running"):
        async with heartbeat(client, "early", namespace=ns, interval=0.05, ttl=0.3):
            pytest.fail("the body must not run")
    assert not await direct.exists(schema.state("early"))
    await eventually(lambda: _unindexed(direct, schema, "early"), within=10)


async def _unindexed(direct: AnyRedis, schema: KeySchema, job_id: str) -> bool:
    await Sweeper(direct, namespace=schema.namespace).sweep()  # drops an entry with no job
    return await direct.zscore(schema.index_for(job_id), job_id) is None
