"""The thread shell (``jobpulse.sync``) against a real Redis: the same protocol and exit rules
as the asyncio shell, one beat thread per client, and the sync reader."""

from __future__ import annotations

import functools
import multiprocessing
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
import redis.cluster

import jobpulse
from jobpulse import JobBusy, JobCancelled, JobState, LeaseLost, LeaseLostCause
from jobpulse._protocol.codec import parse_stream_id
from jobpulse._protocol.keys import KeySchema
from jobpulse.sync import StatusReader, heartbeat

from ..support import spawn_ready, stop
from . import sidecar_clients, work


def test_spawn_pool_job_completes_with_every_item(sync_client: redis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("sync-1")
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        with heartbeat(sync_client, "sync-1", namespace=ns, interval=0.05, ttl=1.0) as hb:
            hb.set_stage("hashing")
            assert pool.submit(work.hash_items, hb.progress, 200, 0.001).result() > 0
            running = sync_client.hgetall(keys.state)
    finally:
        pool.shutdown()
    assert running[b"status"] == b"RUNNING"
    assert running[b"stage"] == b"hashing"
    final = sync_client.hgetall(keys.state)
    assert final[b"status"] == b"COMPLETED"
    assert final[b"done"] == b"200"
    assert not sync_client.exists(keys.alive)


def test_an_exception_writes_failed(sync_client: redis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("boom")
    with (
        pytest.raises(RuntimeError, match="kaput"),
        heartbeat(sync_client, "boom", namespace=ns, interval=0.05, ttl=1.0),
    ):
        raise RuntimeError("kaput")
    final = sync_client.hgetall(keys.state)
    assert final[b"status"] == b"FAILED"
    assert final[b"error"] == b"RuntimeError: kaput"


def test_checkpoint_blocks_until_written(sync_client: redis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("cp")
    with heartbeat(sync_client, "cp", namespace=ns, interval=5.0, ttl=20.0) as hb:
        assert hb.checkpoint(offset=42) is True
        entries = sync_client.xrange(keys.events)
        assert [e[1][b"kind"] for e in entries] == [b"start", b"checkpoint"]
        assert entries[1][1][b"details"] == b'{"offset":42}'


def test_a_second_worker_is_refused(sync_client: redis.Redis, ns: str) -> None:
    with (
        heartbeat(sync_client, "busy", namespace=ns, interval=0.05, ttl=1.0),
        pytest.raises(JobBusy),
    ):
        heartbeat(sync_client, "busy", namespace=ns, interval=0.05, ttl=1.0).__enter__()


def test_remote_cancel_reaches_check_and_ends_cancelled(
    sync_client: redis.Redis, redis_url: str, ns: str
) -> None:
    keys = KeySchema(ns).job("stop-me")
    cancel = redis.Redis.from_url(redis_url)
    with (
        pytest.raises(JobCancelled),
        heartbeat(sync_client, "stop-me", namespace=ns, interval=0.05, ttl=1.0) as hb,
    ):
        assert jobpulse.sync.request_cancel(cancel, "stop-me", namespace=ns, reason="enough")
        # a second request of the same run is recorded once and still answers True
        assert jobpulse.sync.request_cancel(cancel, "stop-me", namespace=ns)
        while not hb.cancelled:
            time.sleep(0.01)
        hb.check()
    assert sync_client.hget(keys.state, "status") == b"CANCELLED"
    requests = [e for e in sync_client.xrange(keys.events) if e[1][b"kind"] == b"cancel"]
    assert [e[1][b"details"] for e in requests] == [b'{"reason":"enough"}']
    # ended: nothing to cancel
    assert jobpulse.sync.request_cancel(cancel, "stop-me", namespace=ns) is False
    assert jobpulse.sync.request_cancel(cancel, "never-ran", namespace=ns) is False
    cancel.close()


def test_sync_request_cancel_refuses_bad_input_before_any_write(
    sync_client: redis.Redis, ns: str
) -> None:
    with pytest.raises(jobpulse.InvalidJobId):
        jobpulse.sync.request_cancel(sync_client, "", namespace=ns)
    with pytest.raises(jobpulse.InvalidJobId):
        jobpulse.sync.request_cancel(sync_client, "x", namespace="")
    with pytest.raises(ValueError, match="maxlen"):
        jobpulse.sync.request_cancel(sync_client, "x", namespace=ns, maxlen=0)
    with pytest.raises(ValueError, match="reason"):
        jobpulse.sync.request_cancel(sync_client, "x", namespace=ns, reason="r" * 5000)
    assert list(sync_client.scan_iter(match=f"{ns}:*")) == []


def test_stolen_lease_raises_lease_lost_at_exit(sync_client: redis.Redis, ns: str) -> None:
    keys = KeySchema(ns).job("stolen")
    with (
        pytest.raises(LeaseLost) as lost,
        heartbeat(sync_client, "stolen", namespace=ns, interval=0.05, ttl=1.0) as hb,
    ):
        sync_client.set(keys.alive, "someone-else:1", px=5000)
        while not hb.cancelled:
            time.sleep(0.01)
        with pytest.raises(JobCancelled):
            hb.check()
    assert lost.value.cause is LeaseLostCause.TAKEN_OVER
    # a worker whose lease was taken over writes no final state
    assert sync_client.hget(keys.state, "status") == b"RUNNING"


def test_current_is_the_sync_heartbeat_in_its_thread_only(
    sync_client: redis.Redis, ns: str
) -> None:
    seen: list[object] = []
    with heartbeat(sync_client, "cur", namespace=ns, interval=0.05, ttl=1.0) as hb:
        assert jobpulse.current() is hb
        other = threading.Thread(target=lambda: seen.append(jobpulse.current()))
        other.start()
        other.join()
    assert seen == [None]
    assert jobpulse.current() is None


def test_many_jobs_share_one_beat_thread(sync_client: redis.Redis, ns: str) -> None:
    """1,000 sync jobs across 16 threads at 1 Hz: every beat lands, one thread beats."""
    before = {t.name for t in threading.enumerate()}
    jobs, per = 1000, 1000 // 16 + 1
    started = threading.Barrier(17)
    release = threading.Event()
    seqs: dict[str, int] = {}
    errors: list[BaseException] = []

    def run(first: int) -> None:
        try:
            hbs = []
            for i in range(first, min(first + per, jobs)):
                hb = heartbeat(
                    sync_client, f"m{i}", namespace=ns, interval=1.0, ttl=6.0, sidecar=False
                )
                hbs.append(hb.__enter__())
            started.wait()
            release.wait()
            for hb in hbs:
                seqs[hb.job_id] = hb.statistics().beats_written
                hb.__exit__(None, None, None)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            started.abort()

    threads = [threading.Thread(target=run, args=(k * per,)) for k in range(16)]
    for t in threads:
        t.start()
    started.wait()
    beat_threads = [t for t in threading.enumerate() if t.name == "jobpulse-beat"]
    time.sleep(3.5)
    release.set()
    for t in threads:
        t.join()
    assert errors == []
    assert len(beat_threads) == 1
    assert "jobpulse-beat" not in before
    assert len(seqs) == jobs
    assert min(seqs.values()) >= 3  # every job beat at 1 Hz (3.5 s: at least 3 beats each)
    statuses = {sync_client.hget(KeySchema(ns).job(f"m{i}").state, "status") for i in range(jobs)}
    assert statuses == {b"COMPLETED"}


def test_sync_reader_get_wait_and_watch(sync_client: redis.Redis, ns: str) -> None:
    reader = StatusReader(sync_client, namespace=ns, cache_ttl=0.0)
    assert reader.get("r1").state is JobState.UNKNOWN
    result: list[JobState] = []
    with heartbeat(sync_client, "r1", namespace=ns, interval=0.05, ttl=1.0, total=3) as hb:
        waiter = threading.Thread(target=lambda: result.append(reader.wait("r1").state))
        waiter.start()
        status = reader.get("r1")
        assert status.state is JobState.RUNNING
        assert status.total == 3
        hb.progress.advance(3)
    waiter.join(10)
    assert result == [JobState.COMPLETED]
    kinds = [event.kind for event in reader.watch("r1")]
    assert kinds[0] == "start"
    assert kinds[-1] == "end"


def test_sync_watch_of_a_killed_worker_ends_with_a_resumable_stale_verdict(
    sync_client: redis.Redis, redis_url: str, ns: str
) -> None:
    """The sync reader's synthetic ``stale`` has a time (the verdict's) and an id of its own,
    after every entry of the stream: resuming from it repeats no entry."""
    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "killed", "1.0")
    try:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        stop(worker)
    reader = StatusReader(sync_client, namespace=ns, cache_ttl=0.0, watch_block=0.2)
    events = list(reader.watch("killed"))
    real = [eid.decode() for eid, _ in sync_client.xrange(KeySchema(ns).job("killed").events)]
    assert [e.id for e in events[:-1]] == real
    last = events[-1]
    assert (last.kind, last.status, last.synthetic) == ("stale", "STALE", True)
    assert parse_stream_id(last.id) > parse_stream_id(real[-1])
    assert last.ts is not None
    assert events[-2].ts is not None
    assert last.ts >= events[-2].ts + 1.0  # at least one ttl after the last entry
    (again,) = list(reader.watch("killed", last_event_id=last.id))
    assert (again.kind, again.synthetic) == ("stale", True)


@pytest.mark.xdist_group("cpu")  # burners never overlap on parallel workers (README)
def test_sync_body_beside_cpu_bound_threads_is_never_stale(
    sync_client: redis.Redis, ns: str
) -> None:
    """Two CPU-bound Python threads hold the GIL: the thread shell's beat thread (sidecar=False,
    what docs/sync.md says of it) still renews (ttl 6 s)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    reader = StatusReader(sync_client, namespace=ns, cache_ttl=0.0)
    states: set[JobState] = set()
    try:
        with heartbeat(
            sync_client, "cpu", namespace=ns, interval=1.0, ttl=6.0, sidecar=False
        ) as hb:
            for t in spinners:
                t.start()
            end = time.monotonic() + 30
            while time.monotonic() < end:
                states.add(reader.get("cpu").state)
                hb.check()
                time.sleep(0.5)
    finally:  # also when the job fails: spinners left behind would starve every later test
        stop.set()
        for t in spinners:
            if t.is_alive():
                t.join()
    assert states == {JobState.RUNNING}


def test_sync_shell_and_reader_on_a_cluster(redis_cluster: Any, ns: str) -> None:
    client = redis.cluster.RedisCluster.from_url(redis_cluster.url, socket_timeout=2.0)
    reader = StatusReader(client, namespace=ns, cache_ttl=0.0)
    try:
        with heartbeat(
            client, "clustered", namespace=ns, interval=0.05, ttl=1.0, total=2, sidecar=False
        ) as hb:
            hb.set_stage("spread")
            assert hb.checkpoint(at=1) is True
            hb.progress.advance(2)
            assert reader.get("clustered").state is JobState.RUNNING
        assert jobpulse.sync.request_cancel(client, "clustered", namespace=ns) is False
        with (
            pytest.raises(JobCancelled),
            heartbeat(  # beaten by the sidecar: its Cluster client comes from a factory
                client,
                "c2",
                namespace=ns,
                interval=0.05,
                client_factory=functools.partial(sidecar_clients.cluster, redis_cluster.url),
            ) as c2,
        ):
            assert jobpulse.sync.request_cancel(client, "c2", namespace=ns) is True
            while not c2.cancelled:
                time.sleep(0.01)
            c2.check()
        assert reader.get("c2").state is JobState.CANCELLED
        status = reader.get("clustered")
        assert status.state is JobState.COMPLETED
        assert status.done == 2
        assert [e.kind for e in reader.watch("clustered")][-1] == "end"
    finally:
        for key in client.scan_iter(match=f"{ns}:*", count=1000, target_nodes="primaries"):
            client.delete(key)
        client.close()
        client.disconnect_connection_pools()  # close() leaves the nodes' pools open
