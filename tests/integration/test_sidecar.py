"""The sidecar (issue 29): a job's beats sent by jobpulse's helper process.

The worker is a real process (tests/integration/sidecar_proc.py) and every observation is made
from THIS process, never from a thread of the worker (which would wait for the same GIL): the
job's status and its ``alive`` key are read in one MULTI, so "RUNNING without alive" (STALE) is
seen exactly when it happens.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync
from jobpulse import JobState, Sweeper
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.rebuild import factory_of
from jobpulse._provision import LocalCluster, RedisServer

from ..support import ROOT, eventually, stop
from . import sidecar_clients

SHELLS = ["sync", "asyncio"]
TTL = 1.0


class Observer:
    """Samples (status, alive exists) of one job from this process until stopped."""

    def __init__(self, url: str, ns: str, job: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.keys = KeySchema(ns)
        self.job = job
        self.samples: list[tuple[float, str | None, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[str | None, bool]:
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.state(self.job), "status")
        pipe.exists(self.keys.alive(self.job))
        status, alive = pipe.execute()
        return (None if status is None else status.decode()), bool(alive)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            status, alive = self.sample()
            self.samples.append((time.monotonic(), status, alive))

    def stale(self) -> list[tuple[float, str | None, bool]]:
        return [s for s in self.samples if s[1] == "RUNNING" and not s[2]]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


@pytest.fixture
def observe(redis_url: str, ns: str) -> Iterator[functools.partial[Observer]]:
    observers: list[Observer] = []

    def make(job: str) -> Observer:
        observers.append(Observer(redis_url, ns, job))
        return observers[-1]

    yield functools.partial(make)
    for o in observers:
        o.close()


def ready_pids(line: str) -> tuple[int, int]:
    _, worker, helper = line.split()
    return int(worker), int(helper)


def spawn_job(
    scenario: str, shell: str, url: str, ns: str, job: str, *, session: bool = False
) -> tuple[Any, int, int]:
    """Start a worker; return it with its pid and its helper's pid (from its ``ready`` line)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.sidecar_proc", scenario, shell, url, ns, job,
         str(TTL)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=session,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    worker, helper = ready_pids(line)
    return proc, worker, helper


def gone(pid: int) -> bool:
    """The process exited (a zombie nobody reaped yet counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("shell", SHELLS)
def test_a_body_holding_the_gil_for_3_ttl_is_never_stale_and_ends_completed(
    shell: str, redis_url: str, ns: str, observe: functools.partial[Observer]
) -> None:
    """One C call holds the GIL (and, in the asyncio shell, the event loop) for ~3 x ttl: the
    helper's beats go on, so the job is never read STALE; it runs once and ends COMPLETED."""
    observer = observe("gil")
    proc, _, _ = spawn_job("gil", shell, redis_url, ns, "gil")
    try:
        assert proc.stdout is not None
        out = proc.stdout.read()
        assert proc.wait() == 0, out
    finally:
        stop(proc)
    held = float(out.split("held ")[1].split()[0])
    assert held > 2 * TTL, f"the test's premise: the GIL was held for {held:.2f} s only"
    observer.close()
    assert observer.samples, "no sample was taken"
    assert observer.stale() == []
    with redis.Redis.from_url(redis_url) as plain:
        status = jobpulse.sync.StatusReader(plain, namespace=ns).get("gil")
    assert status is not None
    assert status.state is JobState.COMPLETED
    assert status.attempt == 1
    assert status.done == 1


@pytest.mark.parametrize("shell", SHELLS)
async def test_a_sigkilled_owner_goes_stale_within_ttl_and_its_helper_exits(
    shell: str, redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    """SIGKILL of the worker: its helper sees the owner's exit at once (pidfd, end of file),
    writes nothing more and exits; the job is STALE within ttl + 0.5 s and a sweeper claims it."""
    proc, worker, helper = spawn_job("forever", shell, redis_url, ns, "doomed")
    keys = KeySchema(ns)
    try:
        await eventually(lambda: _beaten(redis, keys, "doomed"), within=5.0)
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()
        while await redis.exists(keys.alive("doomed")):
            await asyncio.sleep(0.02)
        stale_after = time.monotonic() - killed
        await eventually(lambda: asyncio.to_thread(gone, helper), within=5.0)
    finally:
        stop(proc)
    assert stale_after <= TTL + 0.5
    assert (await redis.hget(keys.state("doomed"), "status")) == b"RUNNING"  # no final write
    sweeper = Sweeper(redis, namespace=ns)

    async def claim() -> list[str]:  # once the index entry's deadline has passed
        return [job.job_id for job in await sweeper.sweep()]

    assert await eventually(claim, within=10) == ["doomed"]


@pytest.mark.parametrize("shell", SHELLS)
async def test_a_sigkilled_helper_fails_the_job_loudly_and_the_next_job_gets_a_new_one(
    shell: str, redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    """SIGKILL of the helper: the owner notices at once (end of file on its pipe), the job's
    block raises ``LeaseLost(SIDECAR_DIED)`` (nobody beats it: STALE within ttl, a sweeper
    records it LOST), and the process's next job starts a new helper and ends COMPLETED."""
    proc, _, helper = spawn_job("helper-dies", shell, redis_url, ns, "orphan")
    keys = KeySchema(ns)
    try:
        assert proc.stdout is not None
        await eventually(lambda: _beaten(redis, keys, "orphan"), within=5.0)
        os.kill(helper, signal.SIGKILL)
        lost = proc.stdout.readline().split()
        second = proc.stdout.readline().split()
        assert proc.wait() == 0
    finally:
        stop(proc)
    assert lost == ["lost", "SIDECAR_DIED"]
    assert second[0] == "second"
    assert int(second[1]) != helper
    assert (await redis.hget(keys.state("orphan-2"), "status")) == b"COMPLETED"
    assert (await redis.hget(keys.state("orphan"), "status")) == b"RUNNING"  # nothing written
    await eventually(lambda: _stale(redis, keys, "orphan"), within=TTL + 1.0)
    sweeper = Sweeper(redis, namespace=ns)

    async def claim() -> list[str]:  # once the index entry's deadline has passed
        return [job.job_id for job in await sweeper.sweep()]

    assert await eventually(claim, within=10) == ["orphan"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_helper_killed_while_a_job_starts_fails_it_with_lease_lost_and_the_next_one_runs(
    shell: str, redis_url: str, ns: str
) -> None:
    """The helper dies while the job's start waits for it (stopped, then SIGKILLed): the block
    raises ``LeaseLost(SIDECAR_DIED)``, as for a death mid-job, and the next job of the process
    starts a new helper and ends COMPLETED. (Before: a ``RuntimeError`` that a worker loop
    handling jobpulse's errors does not expect: the nemesis's sidecar worker ended on it.)"""
    opts: dict[str, Any] = {"namespace": ns, "ttl": 3.0, "interval": 0.5, "sidecar": True}

    async def run_async(job: str) -> int | None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            async with jobpulse.heartbeat(client, job, **opts) as hb:
                return hb.helper_pid  # type: ignore[union-attr]
        finally:
            await client.aclose()

    def run(job: str) -> int | None:
        if shell == "asyncio":
            return asyncio.run(run_async(job))
        with jobpulse.sync.heartbeat(redis.Redis.from_url(redis_url), job, **opts) as hb:
            return hb.helper_pid  # type: ignore[union-attr]

    helper = run(f"{ns}-first")
    assert helper is not None
    os.kill(helper, signal.SIGSTOP)  # it cannot answer the next start
    killer = threading.Timer(0.5, os.kill, (helper, signal.SIGKILL))
    killer.start()
    with pytest.raises(jobpulse.LeaseLost) as lost:
        run(f"{ns}-second")
    killer.join()
    assert lost.value.cause is jobpulse.LeaseLostCause.SIDECAR_DIED
    third = run(f"{ns}-third")
    assert third not in (None, helper)
    with redis.Redis.from_url(redis_url) as client:
        assert client.hget(KeySchema(ns).state(f"{ns}-third"), "status") == b"COMPLETED"


async def _beaten(redis: aioredis.Redis, keys: KeySchema, job: str) -> bool:
    """The job has been beaten a few times (its seq moved past the start)."""
    seq = await redis.hget(keys.state(job), "seq")
    return seq is not None and int(seq) >= 3


async def _stale(redis: aioredis.Redis, keys: KeySchema, job: str) -> bool:
    status = await redis.hget(keys.state(job), "status")
    return status == b"RUNNING" and not await redis.exists(keys.alive(job))


# -- in one process: the client the helper rebuilds ------------------------------------------


def test_a_cluster_client_needs_a_factory_and_nothing_is_written_without_one(
    redis_cluster: LocalCluster, ns: str
) -> None:
    client = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    try:
        with pytest.raises(TypeError, match="client_factory="):
            jobpulse.sync.heartbeat(client, "c-1", namespace=ns)
        assert list(client.scan_iter(match=f"{ns}:*")) == []
        factory = functools.partial(sidecar_clients.cluster, redis_cluster.url)
        with jobpulse.sync.heartbeat(
            client, "c-1", namespace=ns, interval=0.05, ttl=1.0, total=2, client_factory=factory
        ) as hb:
            hb.progress.advance(2)
            assert hb.checkpoint(step=1)
        status = jobpulse.sync.StatusReader(client, namespace=ns).get("c-1")
        assert status is not None
        assert status.state is JobState.COMPLETED
        assert status.done == 2
    finally:
        client.close()
        client.disconnect_connection_pools()  # close() leaves the nodes' pools open


def test_a_factory_the_helper_cannot_load_is_refused_before_any_write(
    redis_url: str, ns: str
) -> None:
    client = redis.Redis.from_url(redis_url)

    def local() -> aioredis.Redis:
        return aioredis.Redis.from_url(redis_url)

    local.__module__ = "__main__"
    try:
        with pytest.raises(ValueError, match="__main__"):
            jobpulse.sync.heartbeat(client, "f-1", namespace=ns, client_factory=local)
        local.__module__ = __name__
        with pytest.raises(TypeError, match="picklable"):
            jobpulse.sync.heartbeat(client, "f-1", namespace=ns, client_factory=local)
        assert list(client.scan_iter(match=f"{ns}:*")) == []
    finally:
        client.close()


def test_an_acl_user_client_is_rebuilt_with_its_username_and_password(
    private_redis: RedisServer, ns: str
) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser("jp", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"])
    admin.config_set("requirepass", "other")  # the default user can no longer get in
    client = redis.Redis(
        host="127.0.0.1", port=private_redis.port, username="jp", password="s3cret"
    )
    try:
        with jobpulse.sync.heartbeat(client, "acl-1", namespace=ns, interval=0.05, ttl=1.0):
            pass
        assert client.hget(KeySchema(ns).state("acl-1"), "status") == b"COMPLETED"
    finally:
        client.close()
        admin.close()


def test_a_tls_client_keeps_its_tls_settings_and_never_shows_its_password() -> None:
    client = redis.Redis(
        host="h", port=6380, ssl=True, ssl_ca_certs="/ca.pem", username="u", password="p"
    )
    factory = factory_of(client)
    assert factory.kind == "ssl"
    assert factory.settings["ssl_ca_certs"] == "/ca.pem"
    assert (factory.settings["username"], factory.settings["password"]) == ("u", "p")
    assert "'p'" not in repr(factory)
    rebuilt = pickle.loads(pickle.dumps(factory))()
    assert isinstance(rebuilt, aioredis.Redis)
    conn = rebuilt.connection_pool.connection_class
    assert conn is redis.asyncio.connection.SSLConnection


# -- in one process: the asyncio face ---------------------------------------------------------


async def test_asyncio_face_records_stage_checkpoint_progress_and_ends_completed(
    redis: aioredis.Redis, ns: str
) -> None:
    async with jobpulse.heartbeat(
        redis, "a-1", namespace=ns, interval=0.05, ttl=1.0, total=3, sidecar=True
    ) as hb:
        assert isinstance(hb, jobpulse.AsyncSidecarHeartbeat)
        assert jobpulse.current() is hb
        assert hb.attempt == 1
        assert hb.resume_from is None
        hb.set_stage("crunch")
        hb.progress.advance(3)
        await hb.checkpoint(step=3)
    status = await jobpulse.StatusReader(redis, namespace=ns, cache_ttl=0).get("a-1")
    assert status.state is JobState.COMPLETED
    assert (status.stage, status.done, status.fence) == ("crunch", 3, hb.fence)
    events = await redis.xrange(KeySchema(ns).events("a-1"))
    assert [b'{"step":3}' in dict(e[1]).get(b"details", b"") for e in events].count(True) == 1


async def test_asyncio_face_statistics_never_wait_for_the_helper(
    redis: aioredis.Redis, ns: str
) -> None:
    """The loop never blocks on the pipe: with the helper stopped (SIGSTOP), ``statistics()``
    returns the counters it sent last (a blocking ask waited up to ``ttl``, 600 s here, past
    the test's timeout); once it runs again, a later call shows newer ones."""
    async with jobpulse.heartbeat(
        redis, "a-4", namespace=ns, interval=0.05, ttl=600.0, sidecar=True
    ) as hb:
        assert isinstance(hb, jobpulse.AsyncSidecarHeartbeat)

        async def written(n: int) -> bool:
            return hb.statistics().beats_written >= n

        await eventually(lambda: written(2))
        pid = hb.helper_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            known = hb.statistics().beats_written
            hb.statistics()
        finally:
            os.kill(pid, signal.SIGCONT)
        await eventually(lambda: written(known + 2))


async def test_asyncio_face_a_cancel_request_cancels_the_body_and_ends_cancelled(
    redis: aioredis.Redis, ns: str
) -> None:
    """The helper's heartbeat sees the request; the owner's body task is cancelled (as with
    in-loop beats) and the block raises JobCancelled; the job ends CANCELLED."""
    with pytest.raises(jobpulse.JobCancelled):
        async with jobpulse.heartbeat(
            redis, "a-2", namespace=ns, interval=0.05, ttl=1.0, sidecar=True
        ):
            await jobpulse.request_cancel(redis, "a-2", namespace=ns)
            await asyncio.sleep(30)  # cancelled long before
    status = await jobpulse.StatusReader(redis, namespace=ns, cache_ttl=0).get("a-2")
    assert status.state is JobState.CANCELLED


async def test_asyncio_face_a_failing_body_ends_failed_with_its_type_and_message(
    redis: aioredis.Redis, ns: str
) -> None:
    with pytest.raises(KeyError):
        async with jobpulse.heartbeat(
            redis, "a-3", namespace=ns, interval=0.05, ttl=1.0, sidecar=True
        ):
            raise KeyError("gone")
    status = await jobpulse.StatusReader(redis, namespace=ns, cache_ttl=0).get("a-3")
    assert status.state is JobState.FAILED
    assert status.error == "KeyError: 'gone'"


def _forked_job(url: str, ns: str, parent_helper: int) -> None:
    """In a child forked while the parent's sidecar job runs: a job of its own, on a helper of
    its own (never the parent's: the fork dropped the parent's pipe)."""
    client = redis.Redis.from_url(url)
    with jobpulse.sync.heartbeat(client, "child", namespace=ns, interval=0.05, ttl=1.0) as hb:
        assert hb.helper_pid not in (None, parent_helper)  # type: ignore[union-attr]
        hb.progress.advance()
    os._exit(0 if client.hget(KeySchema(ns).state("child"), "status") == b"COMPLETED" else 3)


def test_a_child_forked_mid_job_gets_a_helper_of_its_own_and_the_parents_job_goes_on(
    redis_url: str, ns: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        with jobpulse.sync.heartbeat(client, "parent", namespace=ns, interval=0.05, ttl=1.0) as hb:
            helper = hb.helper_pid  # type: ignore[union-attr]
            assert helper is not None
            child = multiprocessing.get_context("fork").Process(
                target=_forked_job, args=(redis_url, ns, helper)
            )
            child.start()
            child.join(30)
            assert child.exitcode == 0
            assert hb.helper_pid == helper  # type: ignore[union-attr]
            assert hb.checkpoint(after="fork")
        assert client.hget(KeySchema(ns).state("parent"), "status") == b"COMPLETED"
    finally:
        client.close()


def test_the_proxies_have_the_public_members_of_the_heartbeats() -> None:
    """The owner's proxy is used where a heartbeat is (current(), integrations): the same
    members, with the same kinds (property or method) and the same parameters."""
    from jobpulse._worker.heartbeat import JobHeartbeat
    from jobpulse._worker.sync_heartbeat import SyncHeartbeat

    members = "set_stage checkpoint stage fence attempt resume_from cancelled check statistics"
    for proxy, shell in (
        (jobpulse.AsyncSidecarHeartbeat, JobHeartbeat),
        (jobpulse.sync.SidecarHeartbeat, SyncHeartbeat),
    ):
        for name in [*members.split(), "lease_held"]:
            mine, theirs = inspect.getattr_static(proxy, name), inspect.getattr_static(shell, name)
            assert type(mine) is type(theirs), (proxy, name)
            if callable(mine):
                params = inspect.signature(mine).parameters
                assert list(params) == list(inspect.signature(theirs).parameters), (proxy, name)
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(theirs)


async def test_a_signal_to_the_whole_process_group_is_the_owners_to_handle(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    """SIGTERM to the worker's process group (an orchestrator stopping it) reaches the helper
    too: the helper ignores it (it lives as long as its owner), so the worker, handling SIGTERM,
    ends its job normally and the final state is written."""
    proc, worker, helper = spawn_job("group-term", "sync", redis_url, ns, "term", session=True)
    keys = KeySchema(ns)
    try:
        assert proc.stdout is not None
        await eventually(lambda: _beaten(redis, keys, "term"), within=5.0)
        os.killpg(worker, signal.SIGTERM)
        assert proc.stdout.readline().split() == ["ok"]
        assert proc.wait() == 0
    finally:
        stop(proc)
    assert (await redis.hget(keys.state("term"), "status")) == b"COMPLETED"
    await eventually(lambda: asyncio.to_thread(gone, helper), within=5.0)  # with its owner
