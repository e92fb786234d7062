"""Celery with ``jobpulse.integrations.celery``: real Celery worker processes, the real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from celery import Celery
from celery.result import AsyncResult

from jobpulse import JobCancelled, JobState, StatusReader, Sweeper, request_cancel
from jobpulse._provision import free_port, server_binary
from jobpulse._worker.arena import NAME_PREFIX
from tests.integrations.order import final_write_seen, first_line, monitor
from tests.support import eventually

pytestmark = pytest.mark.usefixtures("queue_keys")

TTL = 1.0  # what celery_worker.py gives the heartbeat (interval 0.25 s)
WORKER = "tests.integrations.celery_worker"
Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def app(redis_url: str, ns: str) -> Iterator[Celery]:
    """A client app with the worker's broker settings (its keys prefixed by ``ns:``)."""
    client = Celery("jobpulse_test_client", broker=redis_url, backend=redis_url)
    client.conf.update(
        task_default_queue=f"{ns}:q",
        broker_transport_options={"global_keyprefix": f"{ns}:"},
        result_backend_transport_options={"global_keyprefix": f"{ns}:"},
        result_backend_thread_safe=True,  # one backend for the test's threads, closed below
    )
    yield client
    _close(client)


def _close(client: Celery) -> None:
    """Close a client app's sockets. ``app.close()`` closes none: the result backend's client
    and pub/sub and the broker's connections stayed open, in cycles that a later GC collected
    (about 100 "unclosed socket" warnings, 4 to 6 per test here, raised in whichever test ran
    then). The app must share one backend between threads (``result_backend_thread_safe``)."""
    backend = client.backend
    backend.result_consumer.stop()
    backend.client.connection_pool.disconnect()
    client.pool.force_close_all()
    client.close()


@pytest.fixture
def reader(redis: aioredis.Redis, ns: str) -> StatusReader:
    return StatusReader(redis, namespace=ns, cache_ttl=0)


def _send(app: Celery, name: str, task_id: str, *args: Any) -> AsyncResult[Any]:
    return app.send_task(name, args=args, task_id=task_id)


async def _result(res: AsyncResult[Any], timeout: float) -> Any:
    return await asyncio.to_thread(res.get, timeout=timeout, propagate=False)


async def _final(reader: StatusReader, task_id: str) -> Any:
    """The job's status once it is final (Celery stores its result just before ``task_postrun``,
    where the heartbeat ends), else None."""
    status = await reader.get(task_id)
    return status if status.state.is_terminal else None


async def _runs(redis: aioredis.Redis, ns: str, task_id: str) -> int:
    return int(await redis.get(f"{ns}:runs:{task_id}") or 0)


async def test_progress_is_live_then_completed_and_celery_keeps_its_result(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    res = _send(app, "progress", task_id, 40)

    async def advancing() -> Any:
        s = await reader.get(task_id)
        return s if s.state is JobState.RUNNING and s.done > 0 else None

    live = await eventually(advancing, within=10)
    assert (live.kind, live.stage, live.total) == ("progress", "crunch", 40)

    assert await _result(res, 15) == {"items": 40, "job": task_id}
    assert res.state == "SUCCESS"
    done = await eventually(lambda: _final(reader, task_id), within=5)  # task_postrun writes it
    assert (done.state, done.done, done.attempt) == (JobState.COMPLETED, 40, 1)
    assert await _runs(redis, ns, task_id) == 1


async def test_jobpulses_final_write_comes_after_celery_stored_the_result(
    spawn: Spawn, redis_url: str, ns: str, app: Celery
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    async with monitor(redis_url) as mon:
        res = _send(app, "progress", task_id, 4)
        assert await _result(res, 15) == {"items": 4, "job": task_id}
        final = await final_write_seen(mon, task_id, "COMPLETED")
    stored = first_line(mon, "SETEX", f"{ns}:celery-task-meta-{task_id}")
    assert 0 <= stored < final


@pytest.mark.parametrize("mode", ["jobpulse", "plain"])
async def test_a_live_task_past_visibility_timeout_runs_once_with_jobpulse_only(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, mode: str
) -> None:
    # visibility_timeout=3, restore scan every 1 s; the task runs 8 s
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, mode)
    res = _send(app, "sleeper", task_id, 8)
    assert await _result(res, 20) == "slept"
    if mode == "jobpulse":
        assert await _runs(redis, ns, task_id) == 1
    else:
        assert await _runs(redis, ns, task_id) > 1  # restored at +3 s beside the first run


@pytest.mark.parametrize("pool", ["threads", "prefork"])
async def test_prefetched_tasks_waiting_past_visibility_timeout_run_once(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, pool: str
) -> None:
    # One thread or child and Celery's default prefetch multiplier (4): the worker holds all
    # three deliveries, and the last waits 6 s for the slot, twice visibility_timeout (3 s). A
    # first version kept only the running task's delivery fresh: the waiting ones were restored
    # and ran again (the run: one message twice, another three times).
    spawn(WORKER, redis_url, ns, "jobpulse", pool, "1")
    results = [_send(app, "sleeper", f"{ns}-{n}", 3) for n in range(3)]
    for res in results:
        assert await _result(res, 30) == "slept"
    await asyncio.sleep(2)  # a restored copy would be delivered and started by now
    assert [await _runs(redis, ns, f"{ns}-{n}") for n in range(3)] == [1, 1, 1]


async def test_a_countdown_past_visibility_timeout_runs_once(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery
) -> None:
    # the worker holds the delivery for 6 s (visibility_timeout 3 s) before the task starts
    spawn(WORKER, redis_url, ns, "jobpulse")
    res = app.send_task("probe", task_id=f"{ns}-1", countdown=6)
    assert await _result(res, 20) == "heartbeat"
    await asyncio.sleep(2)  # a restored copy would be delivered and started by now
    assert await _runs(redis, ns, f"{ns}-1") == 1


async def test_a_countdown_past_visibility_timeout_runs_once_while_the_helper_starts_slowly(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery
) -> None:
    # The held-deliveries thread stops re-scoring a delivery once its task is active, which
    # leaves it ttl + interval (1.25 s) before it is restorable; the task's heartbeat then
    # enters, starting the sidecar's helper (3 s here). A first merge of the sidecar left the
    # delivery without a re-score until the helper's first one: kombu restored it and it was
    # delivered twice (the countdown test failed so on a loaded machine).
    spawn(WORKER, redis_url, ns, "slowhelper")
    res = app.send_task("probe", task_id=f"{ns}-1", countdown=6)
    assert await _result(res, 20) == "heartbeat"
    await asyncio.sleep(2)  # a restored copy would be delivered and started by now
    assert int(await redis.get(f"{ns}:deliveries:{ns}-1") or 0) == 1
    assert await _runs(redis, ns, f"{ns}-1") == 1


async def test_a_killed_workers_prefetched_task_is_restored_once(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    # Held while the worker lives, handed back once it is dead: the waiting delivery is not
    # kept fresh by anything after the SIGKILL.
    first = spawn(WORKER, redis_url, ns, "jobpulse", "threads", "1")
    res = _send(app, "resumable", f"{ns}-1")
    waiting = _send(app, "probe", f"{ns}-2")
    await eventually(lambda: redis.exists(f"{ns}:checkpointed:{ns}-1"), within=10)
    await asyncio.sleep(4)  # the waiting delivery is past visibility_timeout, still held
    assert await _runs(redis, ns, f"{ns}-2") == 0
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    spawn(WORKER, redis_url, ns, "jobpulse", "threads", "1")
    assert await _result(waiting, 15) == "heartbeat"
    assert await _result(res, 15) == {"resumed_from": {"step": 5}, "attempt": 2}
    assert [await _runs(redis, ns, f"{ns}-{n}") for n in (1, 2)] == [2, 1]


@pytest.fixture
def sentinel_url(redis_url: str) -> Iterator[str]:
    """A Redis Sentinel (one, quorum 1) watching the test server as the master ``jobpulse``; its
    ``sentinel://`` URL."""
    master = urlsplit(redis_url)
    directory = Path(tempfile.mkdtemp(prefix="jobpulse-sentinel-"))
    port = free_port()
    conf = directory / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor jobpulse {master.hostname} {master.port} 1\n"
    )
    proc = subprocess.Popen(
        [server_binary(), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sentinel = redis_sync.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis_sync.ConnectionError):
                if sentinel.execute_command("SENTINEL", "get-master-addr-by-name", "jobpulse"):
                    break
            assert time.monotonic() < deadline, "the sentinel did not answer"
            time.sleep(0.05)
        sentinel.close()
        yield f"sentinel://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_live_task_past_visibility_timeout_runs_once_on_a_sentinel_broker(
    spawn: Spawn, redis_url: str, sentinel_url: str, ns: str, redis: aioredis.Redis
) -> None:
    # a first version re-scored only redis://, rediss:// and unix:// brokers: with sentinel://
    # the task was restored at +3 s beside itself, even with redis= given
    client = Celery("jobpulse_test_client", broker=sentinel_url, backend=redis_url)
    client.conf.update(
        task_default_queue=f"{ns}:q",
        broker_transport_options={"global_keyprefix": f"{ns}:", "master_name": "jobpulse"},
        result_backend_transport_options={"global_keyprefix": f"{ns}:"},
        result_backend_thread_safe=True,
    )
    try:
        spawn(WORKER, redis_url, ns, "jobpulse", "threads", "4", sentinel_url)
        res = _send(client, "sleeper", f"{ns}-1", 6)
        assert await _result(res, 20) == "slept"
        await asyncio.sleep(2)  # a restored copy would be delivered and started by now
        assert await _runs(redis, ns, f"{ns}-1") == 1
    finally:
        _close(client)


@pytest.mark.parametrize("mode", ["jobpulse", "threadbeats"])
async def test_a_task_holding_the_gil_for_3_ttl_runs_once_and_is_never_stale_with_the_sidecar(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    app: Celery,
    reader: StatusReader,
    mode: str,
) -> None:
    # Issue 29: two prefork workers (one child each), acks late, the restore scan every 1 s
    # (visibility_timeout=3). The task holds the GIL for 3 s (3 x ttl) in one C call, so every
    # thread of its process stops: with beats from threads (sidecar=False) the job goes STALE
    # and kombu restores the delivery, whose re-score stopped too, to the other worker (the
    # task runs again); with the sidecar the helper process beats and re-scores meanwhile.
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, mode, "prefork", "1", redis_url, f"{ns}-a")
    spawn(WORKER, redis_url, ns, mode, "prefork", "1", redis_url, f"{ns}-b")
    res = _send(app, "gil_hold", task_id, 3)
    await eventually(lambda: redis.exists(f"{ns}:holding:{task_id}"), within=10)
    seen: set[JobState] = set()
    while not res.ready():  # observed from this process, every 50 ms until Celery has a result
        seen.add((await reader.get(task_id)).state)
        await asyncio.sleep(0.05)
    assert await _result(res, 20) == "held"
    if mode == "threadbeats":
        await asyncio.sleep(3)  # the restored copy, if any, has started by now
        assert await _runs(redis, ns, task_id) > 1
        return
    assert JobState.STALE not in seen
    await asyncio.sleep(3)  # a restored copy would have started by now (scan every 1 s)
    assert int(await redis.get(f"{ns}:deliveries:{task_id}") or 0) == 1
    assert await _runs(redis, ns, task_id) == 1
    final = await eventually(lambda: _final(reader, task_id), within=5)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 1)


async def test_a_killed_workers_task_is_stale_within_ttl_then_resumed_once(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    first = spawn(WORKER, redis_url, ns, "jobpulse")
    res = _send(app, "resumable", task_id)
    await eventually(lambda: redis.exists(f"{ns}:checkpointed:{task_id}"), within=10)

    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.wait()

    async def stale() -> bool:
        return (await reader.get(task_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - killed_at <= TTL + 0.5

    spawn(WORKER, redis_url, ns, "jobpulse")  # its restore scan hands the task back
    assert await _result(res, 15) == {"resumed_from": {"step": 5}, "attempt": 2}
    assert await _runs(redis, ns, task_id) == 2
    final = await eventually(lambda: _final(reader, task_id), within=5)
    assert (final.state, final.attempt) == (JobState.COMPLETED, 2)


async def test_request_cancel_fails_the_task_in_celery_with_job_cancelled(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    res = _send(app, "sleeper", task_id, 30)

    async def running() -> bool:
        return (await reader.get(task_id)).state is JobState.RUNNING

    await eventually(running, within=10)
    assert await request_cancel(redis, task_id, namespace=ns)

    outcome = await _result(res, 10)
    assert res.state == "FAILURE"
    assert isinstance(outcome, JobCancelled)
    assert (await eventually(lambda: _final(reader, task_id), within=5)).state is JobState.CANCELLED
    assert await _runs(redis, ns, task_id) == 1


async def test_without_the_integration_tasks_run_and_current_is_none(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "plain")
    assert await _result(_send(app, "probe", task_id), 10) == "none"
    assert (await reader.get(task_id)).state is JobState.UNKNOWN


async def _revoke_running(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, signal_name: str
) -> tuple[str, int]:
    """Run ``sleeper`` on a prefork worker of one child, revoke it with ``terminate=True`` and
    ``signal_name`` once it runs; return its task id and child pid once Celery says REVOKED and
    the child is gone."""
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse", "prefork")
    _send(app, "sleeper", task_id, 30)
    child = int(await eventually(lambda: redis.lindex(f"{ns}:pids:{task_id}", 0), within=10))
    await asyncio.to_thread(app.control.revoke, task_id, terminate=True, signal=signal_name)

    async def revoked() -> bool:
        state = await asyncio.to_thread(lambda: AsyncResult(task_id, app=app).state)
        return bool(state == "REVOKED")

    await eventually(revoked, within=10)
    await eventually(lambda: asyncio.to_thread(_gone, child), within=5)
    # acknowledged as revoked: nothing left for kombu to restore
    assert await redis.zcard(f"{ns}:unacked_index") == 0
    assert await redis.hlen(f"{ns}:unacked") == 0
    return task_id, child


async def test_revoke_terminate_is_revoked_in_celery_and_cancelled_in_jobpulse(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    # SIGTERM (the default): the prefork child's handler raises SystemExit through the body and
    # Celery sends task_postrun with no state; a first version recorded that COMPLETED
    task_id, child = await _revoke_running(spawn, redis_url, ns, redis, app, "SIGTERM")
    final = await eventually(lambda: _final(reader, task_id), within=5)
    assert (final.state, final.attempt) == (JobState.CANCELLED, 1)
    assert final.error is not None
    assert final.error.startswith("JobCancelled: the task was interrupted by SystemExit")
    assert await _runs(redis, ns, task_id) == 1
    assert _segments_of(child) == []


async def test_revoke_terminate_sigkill_is_stale_within_ttl_then_lost_at_the_next_sweep(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id, _ = await _revoke_running(spawn, redis_url, ns, redis, app, "SIGKILL")
    gone_at = time.monotonic()

    async def stale() -> bool:
        return (await reader.get(task_id)).state is JobState.STALE

    await eventually(stale, within=TTL + 0.5)
    assert time.monotonic() - gone_at <= TTL + 0.5
    # a sweeper claims it once its index deadline passed (the index is refreshed every few beats)
    sweeper, claimed = Sweeper(redis, namespace=ns), list[str]()

    async def swept() -> bool:
        claimed.extend(job.job_id for job in await sweeper.sweep())
        return bool(claimed)

    await eventually(swept, within=10)
    assert claimed == [task_id]
    final = await reader.get(task_id)
    assert (final.state, final.attempt) == (JobState.LOST, 1)
    assert await _runs(redis, ns, task_id) == 1


async def test_a_rejected_task_is_failed_in_jobpulse_not_completed(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    _send(app, "rejecter", task_id)
    final = await eventually(lambda: _final(reader, task_id), within=10)
    assert final.state is JobState.FAILED
    assert final.error == "Reject: ('not for this worker', False)"
    assert await _runs(redis, ns, task_id) == 1


async def test_an_ignored_task_is_failed_in_jobpulse_not_completed(
    spawn: Spawn, redis_url: str, ns: str, redis: aioredis.Redis, app: Celery, reader: StatusReader
) -> None:
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    _send(app, "ignorer", task_id)
    final = await eventually(lambda: _final(reader, task_id), within=10)
    assert (final.state, final.error) == (JobState.FAILED, "Ignore: handled elsewhere")
    assert await _runs(redis, ns, task_id) == 1


@pytest.mark.parametrize("task", ["replacer", "slow_replacer"])
async def test_a_replaced_task_ends_with_its_replacement_as_a_second_run(
    spawn: Spawn,
    redis_url: str,
    ns: str,
    redis: aioredis.Redis,
    app: Celery,
    reader: StatusReader,
    task: str,
) -> None:
    # task.replace(): Celery IGNORED for the first body, the replacement runs under the same id.
    # slow_replacer's replacement starts while the replaced run still holds the job: it waits for
    # that run's end (a duplicate delivery of a live job would raise JobBusy instead)
    task_id = f"{ns}-1"
    spawn(WORKER, redis_url, ns, "jobpulse")
    res = _send(app, task, task_id)
    assert await _result(res, 15) == "heartbeat"
    final = await eventually(lambda: _final(reader, task_id), within=5)
    assert (final.state, final.attempt, final.kind) == (JobState.COMPLETED, 2, "probe")
    assert await _runs(redis, ns, task_id) == 2


def _gone(pid: int) -> bool:
    """The process is gone or a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def _segments_of(pid: int) -> list[str]:
    """The jobpulse shared-memory blocks the process ``pid`` created that are still named."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"{NAME_PREFIX}{pid}_*"))
