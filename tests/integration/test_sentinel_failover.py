"""Sentinel: a master, a replica and three sentinels on loopback; the master is SIGKILLed while
jobs run, the sentinels promote the replica, and the worker, reader and sweeper (all on clients
from ``Sentinel(...).master_for(...)``; the asyncio API, and the sync shell and reader on
``redis.sentinel.Sentinel``) carry on against the promoted master."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.sentinel import Sentinel as SyncSentinel

import jobpulse
from jobpulse import (
    Event,
    JobBusy,
    JobCancelled,
    JobState,
    StaleJob,
    StatusReader,
    Sweeper,
    heartbeat,
    request_cancel,
)
from jobpulse._protocol.errors import is_redis_fault
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.rebuild import ClientFactory
from jobpulse._provision import LocalSentinel

from ..support import eventually
from . import sidecar_clients

pytestmark = pytest.mark.destructive

EXPECTED = {
    "ok-1": JobState.COMPLETED,
    "ok-2": JobState.COMPLETED,
    "fails": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
}
TTL = 10.0  # longer than a failover (down-after 1 s + election + promotion: ~2 to 4 s here)


@pytest.fixture
def sentinel_setup() -> Iterator[LocalSentinel]:
    with LocalSentinel(down_after=1000) as setup:
        yield setup


async def seqs(client: aioredis.Redis, ns: str) -> dict[str, int]:
    """Every job's snapshot ``seq`` on the server of ``client``; all 0 while that server cuts
    its clients (the sentinels' CLIENT KILL after the promotion)."""
    schema = KeySchema(ns)
    try:
        raws = [await client.hget(schema.state(job), "seq") for job in EXPECTED]
    except RedisConnectionError:
        return dict.fromkeys(EXPECTED, 0)
    return {job: int(raw or 0) for job, raw in zip(EXPECTED, raws, strict=True)}


async def test_jobs_run_on_through_a_sentinel_failover(
    sentinel_setup: LocalSentinel, ns: str
) -> None:
    sentinel = Sentinel(sentinel_setup.sentinel_addresses, socket_timeout=1.0)
    client = sentinel.master_for(sentinel_setup.name, socket_timeout=2.0)
    replica = sentinel_setup.replicas[0]
    promoted = aioredis.Redis.from_url(replica.url)  # looked at directly, never by the code
    stop = asyncio.Event()
    fences: dict[str, int] = {}
    claimed: list[StaleJob] = []

    async def job(job_id: str) -> None:
        async with heartbeat(
            client, job_id, namespace=ns, interval=0.1, ttl=TTL, final_timeout=TTL
        ) as hb:
            fences[job_id] = hb.fence
            while job_id == "cancelled" or not stop.is_set():
                hb.progress.advance()
                await asyncio.sleep(0.02)  # the job's work
            if job_id == "fails":
                raise RuntimeError("boom")

    async def sweep_forever(sweeper: Sweeper) -> None:
        while True:
            try:
                claimed.extend(await sweeper.sweep())
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise
            await asyncio.sleep(0.2)

    async def watch(reader: StatusReader) -> list[Event]:
        return [e async for e in reader.watch("ok-1")]

    tasks = {j: asyncio.create_task(job(j)) for j in EXPECTED}
    sweeper = asyncio.create_task(sweep_forever(Sweeper(client, namespace=ns)))
    try:
        async with StatusReader(client, namespace=ns, cache_ttl=0) as reader:
            watching = asyncio.create_task(watch(reader))

            async def replicated() -> bool:  # a few beats of every job reached the replica
                return min((await seqs(promoted, ns)).values()) >= 5

            await eventually(replicated, within=20)
            before = await seqs(promoted, ns)
            sentinel_setup.master.stop()  # SIGKILL: whatever it did not replicate is lost

            async def failed_over() -> bool:
                try:
                    _, port = await sentinel.discover_master(sentinel_setup.name)
                except MasterNotFoundError:  # the sentinels see the master down: failing over
                    return False
                return bool(port == replica.port)

            try:
                await eventually(failed_over, within=30, step=0.2)
            except TimeoutError:
                raise AssertionError(f"no failover:\n{sentinel_setup.logs()}") from None

            async def beating_on() -> bool:  # the same workers' beats land on the new master
                now = await seqs(promoted, ns)
                return all(now[j] >= before[j] + 10 for j in EXPECTED)

            await eventually(beating_on, within=TTL)
            with pytest.raises(JobBusy):  # the lease is held on the new master: one owner
                async with heartbeat(client, "ok-2", namespace=ns, ttl=TTL):
                    pass
            await request_cancel(client, "cancelled", namespace=ns)
            stop.set()
            await tasks["ok-1"]
            await tasks["ok-2"]
            with pytest.raises(RuntimeError, match="boom"):
                await tasks["fails"]
            with pytest.raises(JobCancelled):
                await tasks["cancelled"]
            events = await asyncio.wait_for(watching, 30)
            finals = {j: await reader.get(j) for j in EXPECTED}
    finally:
        stop.set()
        for task in (*tasks.values(), sweeper):
            task.cancel()
        for task in (*tasks.values(), sweeper):
            with contextlib.suppress(BaseException):
                await task
        await client.aclose()
        await promoted.aclose()
        for s in sentinel.sentinels:
            await s.aclose()

    assert claimed == []  # no job was falsely claimed
    for job_id, state in EXPECTED.items():
        status = finals[job_id]
        assert status.state is state, job_id
        assert status.fence == fences[job_id], job_id  # nobody else took it
        assert status.attempt == 1, job_id
    assert finals["fails"].error == "RuntimeError: boom"
    assert events[-1].kind == "end"
    assert events[-1].status == "COMPLETED"
    ids = [e.id for e in events]
    assert ids == sorted(set(ids), key=lambda i: tuple(map(int, i.split("-"))))


def _sync_job(
    client: redis.Redis,
    job_id: str,
    ns: str,
    stop: threading.Event,
    fences: dict[str, int],
    factory: ClientFactory,
) -> None:
    """A sync job (a thread): runs until ``stop``; "cancelled" runs until its cancel arrives.
    Its beats come from the sidecar helper, whose client ``factory`` builds (Sentinel)."""
    with jobpulse.sync.heartbeat(
        client,
        job_id,
        namespace=ns,
        interval=0.1,
        ttl=TTL,
        final_timeout=TTL,
        client_factory=factory,
    ) as hb:
        fences[job_id] = hb.fence
        while job_id == "cancelled" or not stop.is_set():
            hb.progress.advance()
            hb.check()  # raises JobCancelled once the cancel request reached the worker
            time.sleep(0.02)  # the job's work
        if job_id == "fails":
            raise RuntimeError("boom")


async def test_sync_jobs_run_on_through_a_sentinel_failover(
    sentinel_setup: LocalSentinel, ns: str
) -> None:
    """The sync shell (beaten by the sidecar helper, its client rebuilt by a ``client_factory``)
    and the sync reader on ``redis.sentinel.Sentinel(...).master_for(...)``, a sweeper beside
    them (on an asyncio Sentinel client): the master is SIGKILLed while the jobs run."""
    sync_sentinel = SyncSentinel(sentinel_setup.sentinel_addresses, socket_timeout=1.0)
    client = sync_sentinel.master_for(sentinel_setup.name, socket_timeout=2.0)
    sentinel = Sentinel(sentinel_setup.sentinel_addresses, socket_timeout=1.0)
    aclient = sentinel.master_for(sentinel_setup.name, socket_timeout=2.0)
    replica = sentinel_setup.replicas[0]
    promoted = aioredis.Redis.from_url(replica.url)  # looked at directly, never by the code
    stop = threading.Event()
    factory = functools.partial(
        sidecar_clients.sentinel_master,
        tuple(sentinel_setup.sentinel_addresses),
        sentinel_setup.name,
    )
    fences: dict[str, int] = {}
    claimed: list[StaleJob] = []

    async def sweep_forever(sweeper: Sweeper) -> None:
        while True:
            try:
                claimed.extend(await sweeper.sweep())
            except Exception as exc:
                if not is_redis_fault(exc):
                    raise
            await asyncio.sleep(0.2)

    jobs = {
        j: asyncio.create_task(asyncio.to_thread(_sync_job, client, j, ns, stop, fences, factory))
        for j in EXPECTED
    }
    sweeper = asyncio.create_task(sweep_forever(Sweeper(aclient, namespace=ns)))
    reader = jobpulse.sync.StatusReader(client, namespace=ns, cache_ttl=0)
    try:

        async def replicated() -> bool:
            return min((await seqs(promoted, ns)).values()) >= 5

        await eventually(replicated, within=20)
        before = await seqs(promoted, ns)
        sentinel_setup.master.stop()  # SIGKILL: whatever it did not replicate is lost

        async def failed_over() -> bool:
            try:
                _, port = await sentinel.discover_master(sentinel_setup.name)
            except MasterNotFoundError:
                return False
            return bool(port == replica.port)

        try:
            await eventually(failed_over, within=30, step=0.2)
        except TimeoutError:
            raise AssertionError(f"no failover:\n{sentinel_setup.logs()}") from None

        async def beating_on() -> bool:  # the same workers' beats land on the new master
            now = await seqs(promoted, ns)
            return all(now[j] >= before[j] + 10 for j in EXPECTED)

        await eventually(beating_on, within=TTL)

        def second_owner() -> None:
            with jobpulse.sync.heartbeat(
                client, "ok-2", namespace=ns, ttl=TTL, client_factory=factory
            ):
                pass

        with pytest.raises(JobBusy):  # the lease is held on the new master: one owner
            await asyncio.to_thread(second_owner)
        assert (await asyncio.to_thread(reader.get, "ok-1")).state is JobState.RUNNING
        await request_cancel(aclient, "cancelled", namespace=ns)
        stop.set()
        await jobs["ok-1"]
        await jobs["ok-2"]
        with pytest.raises(RuntimeError, match="boom"):
            await jobs["fails"]
        with pytest.raises(JobCancelled):
            await jobs["cancelled"]
        finals = {j: await asyncio.to_thread(reader.get, j) for j in EXPECTED}
    finally:
        stop.set()
        sweeper.cancel()
        with contextlib.suppress(BaseException):
            await sweeper
        for task in jobs.values():  # threads: they end once stop is set (or the lease is lost)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 2 * TTL)
        client.close()
        await aclient.aclose()
        await promoted.aclose()
        for s in sentinel.sentinels:
            await s.aclose()
        for ss in sync_sentinel.sentinels:
            ss.close()

    assert claimed == []  # no job was falsely claimed
    for job_id, state in EXPECTED.items():
        status = finals[job_id]
        assert status.state is state, job_id
        assert status.fence == fences[job_id], job_id  # nobody else took it
        assert status.attempt == 1, job_id
    assert finals["fails"].error == "RuntimeError: boom"
