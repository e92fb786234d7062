"""Issue 12, protocol side: a job id's identity across runs, attempts in the stream, claims
delivered until acknowledged, and the index written before the acquire. Each test runs on a
single Redis and on the 3-master cluster (``client``)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse import Event, JobState, StaleJob, StatusReader, Sweeper, heartbeat
from jobpulse._protocol import calls
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS, evalsha
from jobpulse._provision import LocalCluster
from jobpulse.http.app import etag_of

from ..support import eventually, spawn_ready, spawn_worker, stop, url_of

AnyRedis = aioredis.Redis | RedisCluster


async def _gone(client: AnyRedis, *keys: str) -> bool:
    return all([not await client.exists(key) for key in keys])


async def _stale_job(client: AnyRedis, ns: str, job_id: str) -> None:
    """A job whose worker process was SIGKILLed: RUNNING, indexed, liveness gone (STALE)."""
    proc = spawn_worker(url_of(client), ns, job_id, 0.3)
    stop(proc)
    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    try:
        await eventually(lambda: _state_is(reader, job_id, JobState.STALE), within=10)
    finally:
        await reader.aclose()


async def _claim(sweeper: Sweeper) -> StaleJob:
    """The one job a sweep claims once the stale job's index deadline has passed."""
    (job,) = await eventually(sweeper.sweep, within=10)
    return job


async def _state_is(reader: StatusReader, job_id: str, state: JobState) -> bool:
    return (await reader.get(job_id)).state is state


# -- 1. identity across runs ----------------------------------------------------------------------


async def test_a_rerun_after_retention_is_newer_than_the_run_before(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("rerun")
    reader = StatusReader(client, namespace=ns, cache_ttl=0)  # long-lived: it saw run 1
    try:
        async with heartbeat(
            client, "rerun", namespace=ns, retention=0.5, interval=30, ttl=60
        ) as hb:
            for i in range(20):
                await hb.checkpoint(step=i)
        first = await reader.get("rerun")
        assert first.state is JobState.COMPLETED
        assert first.seq is not None
        assert first.seq >= 22  # 1 + 20 checkpoints + the end (+ a beat a NOSCRIPT refused)
        await eventually(lambda: _gone(client, keys.state, keys.fence), within=10)

        with pytest.raises(OSError, match="disk full"):
            async with heartbeat(client, "rerun", namespace=ns, retention=60) as hb:
                raise OSError("disk full")
        second = await reader.get("rerun")
        assert second.state is JobState.FAILED
        assert second.error == "OSError: disk full"
        assert second.seq is not None
        assert second.seq < 22
        assert second.fence is not None
        assert first.fence is not None
        assert second.fence > first.fence
        assert etag_of(second) != etag_of(first)
    finally:
        await reader.aclose()


async def test_a_cancel_request_changes_the_etag_at_once(client: AnyRedis, ns: str) -> None:
    from jobpulse import request_cancel

    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    try:
        async with heartbeat(client, "etag", namespace=ns, interval=30, ttl=60) as hb:
            before = etag_of(await reader.get("etag"))
            assert await request_cancel(client, "etag", namespace=ns)
            after = await reader.get("etag")
            assert after.cancel_requested is True
            assert after.seq == hb.statistics().seq  # no beat in between: the same version
            assert etag_of(after) != before
    finally:
        await reader.aclose()


# -- 2. and 3. attempts in the stream; history kept on resume ------------------------------------


async def test_watch_follows_the_current_attempt_past_an_earlier_stale_entry(
    client: AnyRedis, ns: str
) -> None:
    await _stale_job(client, ns, "again")
    claimed = await _claim(Sweeper(client, namespace=ns))
    reader = StatusReader(client, namespace=ns, cache_ttl=0)
    seen: list[Event] = []

    async def follow() -> None:
        async for event in reader.watch("again"):  # no last_event_id: from the stream's start
            seen.append(event)

    try:
        async with heartbeat(client, "again", namespace=ns, interval=0.1, ttl=1) as hb:
            watcher = asyncio.create_task(follow())
            await eventually(
                lambda: _true(any(e.kind == "start" and e.fence == hb.fence for e in seen))
            )
            assert not watcher.done()  # the earlier attempt's `stale` entry did not end it
            await hb.checkpoint(step=1)
        await asyncio.wait_for(watcher, 10)
    finally:
        await reader.aclose()
    kinds = [(e.kind, e.attempt) for e in seen if e.kind != "beat"]
    assert kinds == [
        ("start", 1),
        ("stale", 1),
        ("start", 2),
        ("checkpoint", None),
        ("end", 2),
    ]
    assert seen[1].fence == claimed.fence
    assert {e.fence for e in seen[2:]} == {hb.fence}
    assert seen[-1].status == "COMPLETED"


async def _true(value: bool) -> bool:
    return value


async def test_resume_without_a_checkpoint_keeps_the_job_history(client: AnyRedis, ns: str) -> None:
    keys = KeySchema(ns).job("history")
    await _stale_job(client, ns, "history")
    await _claim(Sweeper(client, namespace=ns))
    async with heartbeat(client, "history", namespace=ns) as hb:
        assert hb.attempt == 2
        assert hb.resume_from is None  # the dead attempt never checkpointed
    entries = [(e[1][b"kind"], e[1][b"attempt"]) for e in await client.xrange(keys.events)]
    entries = [e for e in entries if e[0] != b"beat"]
    assert entries == [
        (b"start", b"1"),
        (b"stale", b"1"),
        (b"start", b"2"),
        (b"end", b"2"),
    ]


async def test_a_fresh_start_after_a_terminal_run_appends_to_the_stream(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("fresh")
    async with heartbeat(client, "fresh", namespace=ns) as first:
        pass
    async with heartbeat(client, "fresh", namespace=ns) as second:
        pass
    entries = [(e[1][b"kind"], int(e[1][b"fence"])) for e in await client.xrange(keys.events)]
    assert entries == [
        (b"start", first.fence),
        (b"end", first.fence),
        (b"start", second.fence),
        (b"end", second.fence),
    ]
    assert second.fence > first.fence


# -- 4. claims: exactly once, delivered at least once ----------------------------------------


async def test_a_claim_whose_reply_was_lost_is_returned_by_a_later_sweep(
    client: AnyRedis, ns: str
) -> None:
    await _stale_job(client, ns, "lost-reply")
    keys = KeySchema(ns).job("lost-reply")
    # What a sweeper sends; its reply never reaches anyone (a crash, a cut link, a cancelled
    # sweep): the job is LOST in Redis, and no StaleJob was handed out.
    first = await evalsha(
        client, SCRIPTS.claim, keys.all(), [1000, 60_000, "stale: test", 0, "gone-sweeper"]
    )
    assert first[0] == 1
    job = await _claim(Sweeper(client, namespace=ns))  # another sweeper, later
    assert (job.job_id, job.attempt, job.fence) == ("lost-reply", 1, first[1])
    assert job.snapshot["status"] == "RUNNING"


async def test_an_unacknowledged_claim_is_delivered_again_by_any_sweeper(
    client: AnyRedis, ns: str
) -> None:
    await _stale_job(client, ns, "unacked")
    one = Sweeper(client, namespace=ns, redeliver_after=0.3)
    two = Sweeper(client, namespace=ns, redeliver_after=0.3)
    job = await _claim(one)
    assert await two.sweep() == []  # not before redeliver_after
    again: list[StaleJob] = await eventually(two.sweep, within=5)
    assert [(j.job_id, j.attempt, j.fence, j.claimed_at_ms) for j in again] == [
        (job.job_id, job.attempt, job.fence, job.claimed_at_ms)
    ]
    assert await two.ack(again[0]) is True
    assert await one.ack(job) is True  # acknowledged already: the same answer
    await asyncio.sleep(0.4)
    assert await one.sweep() == []
    shard = KeySchema(ns).index_for("unacked")
    assert await client.zscore(shard, "unacked") is None  # dropped by that sweep


async def test_run_redelivers_a_job_whose_handler_failed_and_acks_it_once_handled(
    client: AnyRedis, ns: str
) -> None:
    await _stale_job(client, ns, "handler")
    calls: list[tuple[str, int]] = []
    handled = asyncio.Event()

    async def on_stale(job: StaleJob) -> None:
        calls.append((job.job_id, job.attempt))
        if len(calls) == 1:
            raise RuntimeError("handler failed")
        handled.set()

    sweeper = Sweeper(client, namespace=ns, redeliver_after=0.2)
    async with sweeper.run(period=0.05, on_stale=on_stale):
        await asyncio.wait_for(handled.wait(), 10)
        await asyncio.sleep(0.5)  # more sweeps, after redeliver_after: nothing more arrives
    assert calls == [("handler", 1), ("handler", 1)]
    keys = KeySchema(ns).job("handler")
    assert await client.hget(keys.state, "claim") is None


async def test_a_new_attempt_acknowledges_the_claim(client: AnyRedis, ns: str) -> None:
    await _stale_job(client, ns, "restart")
    sweeper = Sweeper(client, namespace=ns, redeliver_after=0.2)
    job = await _claim(sweeper)
    async with heartbeat(client, "restart", namespace=ns, interval=0.1, ttl=1) as hb:
        assert hb.attempt == job.attempt + 1
        await asyncio.sleep(0.4)
        assert await sweeper.sweep() == []  # RUNNING and alive: not delivered again
    assert await sweeper.ack(job) is False


# -- 5. and 6. the running-jobs index --------------------------------------------------------


async def test_the_index_entry_exists_before_the_job_is_running(client: AnyRedis, ns: str) -> None:
    schema = KeySchema(ns)
    shard = schema.index_for("intent")
    # An acquire that reaches Redis after its index entry could be gone starts nothing.
    keys = schema.job("intent")
    deadline = int(await evalsha(client, SCRIPTS.enroll, (shard,), ["intent", 1000]))
    late = [b"tok", 1000, 100, "w", "", "", "", "", deadline - 2000]  # its latest start: passed
    assert await evalsha(client, SCRIPTS.acquire, keys.all(), late) == [-1]
    assert not await client.exists(keys.state)
    # The sweeper drops an entry whose acquire never ran.
    await client.zadd(shard, {"intent": 1})
    assert await Sweeper(client, namespace=ns).sweep() == []
    assert await client.zscore(shard, "intent") is None
    # A job that runs is indexed with a deadline ahead of the server clock.
    async with heartbeat(client, "intent", namespace=ns, interval=0.1, ttl=1):
        seconds, _ = await client.time()
        score = await client.zscore(shard, "intent")
        assert score is not None
        assert score > seconds * 1000


async def test_enroll_always_moves_the_deadline_on(client: AnyRedis, ns: str) -> None:
    shard = KeySchema(ns).index(0)
    await client.zadd(shard, {"job": 10**13})  # an entry far ahead (an earlier attempt's)
    deadline = await evalsha(client, SCRIPTS.enroll, (shard,), ["job", 1000])
    assert deadline == 10**13 + 1
    assert await client.zscore(shard, "job") == 10**13 + 1


# -- 8. replay of a beat (the proxy tests are in tests/faults/test_replay.py) ------------------


async def test_a_replayed_beat_answers_as_written_and_writes_nothing_again(
    client: AnyRedis, ns: str
) -> None:
    keys = KeySchema(ns).job("beat")
    ok = await evalsha(
        client, SCRIPTS.acquire, keys.all(), ["tok", 60_000, 100, "w", "", "", "", ""]
    )
    fence, seq = ok[1], ok[3] + 1

    def at(n: int) -> calls.Call[calls.BeatReply]:
        return calls.beat(
            keys.all(),
            calls.beat_segment(
                token="tok",
                fence=fence,
                ttl_ms=60_000,
                seq=n,
                fields={"done": "5", "total": "", "stage": ""},
                event=("checkpoint", '{"a":1}', 100),
                pairs=("checkpoint", '{"a":1}'),
            ),
        )

    first = await calls.run(client, at(seq))
    again = await calls.run(client, at(seq))
    assert first.code is again.code is calls.BeatCode.WRITTEN
    assert again.now_ms >= first.now_ms > 0
    kinds = [e[1][b"kind"] for e in await client.xrange(keys.events)]
    assert kinds == [b"start", b"checkpoint"]
    older = await calls.run(client, at(seq - 1))
    assert older.code is calls.BeatCode.SEQ_BEHIND  # a seq below the snapshot's is refused
    assert older.snapshot_seq == seq


@pytest.mark.parametrize("loss", ["gone", "older"])
async def test_a_beat_behind_what_landed_answers_resend_everything_and_so_does_its_replay(
    client: AnyRedis, ns: str, loss: str
) -> None:
    """A beat carries the seq its worker knows landed. A snapshot behind it (gone: a restart
    that lost the data; older: a restart from an older RDB, a promoted replica that missed the
    last writes, which restore ``alive`` as of the same moment: one script writes both) is
    answered 3 and nothing of the beat is written, so the beat's replay finds the same snapshot
    and answers 3 too; the beat of every field (landed 0) repairs it."""
    keys = KeySchema(ns).job("behind")
    ok = await evalsha(
        client, SCRIPTS.acquire, keys.all(), ["tok", 60_000, 100, "w", "", "", "", "etl"]
    )
    fence, seq = ok[1], ok[3]

    def at(n: int, landed: int, row: int, **more: str) -> calls.Call[calls.BeatReply]:
        return calls.beat(
            keys.all(),
            calls.beat_segment(
                token="tok",
                fence=fence,
                ttl_ms=60_000,
                seq=n,
                landed=landed,
                fields={"done": str(row), "total": "", "stage": "", **more},
                event=("checkpoint", f'{{"row":{row}}}', 100),
                pairs=("checkpoint", f'{{"row":{row}}}'),
            ),
        )

    assert (await calls.run(client, at(seq + 1, seq, 10))).code is calls.BeatCode.WRITTEN
    older = await client.dump(keys.state)
    older_alive = await client.dump(keys.alive)
    assert (await calls.run(client, at(seq + 2, seq + 1, 500))).code is calls.BeatCode.WRITTEN
    if loss == "gone":
        await client.delete(*keys.all())
    else:
        await client.restore(keys.state, 0, older, replace=True)
        await client.restore(keys.alive, 60_000, older_alive, replace=True)
    before = await client.hgetall(keys.state)
    entries = await client.xlen(keys.events)

    first = await calls.run(client, at(seq + 3, seq + 2, 600))
    again = await calls.run(client, at(seq + 3, seq + 2, 600))  # the client's retry
    assert first.code is again.code is calls.BeatCode.RESEND_STATIC
    held = seq + 1 if loss == "older" else 0  # the snapshot's seq: alive carries it
    assert await client.get(keys.alive) == f"tok:{fence}:{held}:0".encode()  # renewed/re-taken
    after = await client.hgetall(keys.state)
    assert after == {**before, b"status": b"RUNNING", b"fence": str(fence).encode()}
    assert await client.xlen(keys.events) == entries  # no entry either

    full = at(seq + 4, 0, 600, rate="", eta_s="", rss_bytes="", cpu_s="", loop_lag_ms="")
    assert (await calls.run(client, full)).code is calls.BeatCode.WRITTEN
    state = await client.hgetall(keys.state)
    assert (state[b"seq"], state[b"checkpoint"]) == (str(seq + 4).encode(), b'{"row":600}')


async def test_a_snapshot_rolled_back_under_a_live_worker_is_repaired(
    client: AnyRedis, ns: str
) -> None:
    """An older snapshot under a live worker (its lease survived: a restart from an older RDB,
    a promoted replica that missed the last writes; ``alive``, written by the same scripts, is
    restored as of the same moment) is repaired by the worker's next beats: the checkpoint and
    stage it wrote come back. Beats carry only changed fields, so they used to leave the older
    checkpoint for the rest of the run (issue 24, item 2)."""
    keys = KeySchema(ns).job("rolled")
    async with heartbeat(client, "rolled", namespace=ns, interval=0.05, ttl=10, kind="etl") as hb:
        hb.set_stage("load")
        await hb.checkpoint(row=10)
        older = await client.dump(keys.state)
        older_alive = await client.dump(keys.alive)  # at most a beat later: still behind
        hb.set_stage("crunch")
        await hb.checkpoint(row=500)
        await client.restore(keys.state, 0, older, replace=True)
        await client.restore(keys.alive, 10_000, older_alive, replace=True)
        assert await client.hget(keys.state, "checkpoint") == b'{"row":10}'
        await eventually(lambda: _holds(client, keys.state, "checkpoint", b'{"row":500}'))
        assert await client.hget(keys.state, "stage") == b"crunch"
        assert await client.hget(keys.state, "kind") == b"etl"
        assert hb.statistics().lease == "held"
    kinds = [e[1][b"kind"] for e in await client.xrange(keys.events)]
    assert [k for k in kinds if k not in (b"beat", b"stage")] == [
        b"start",
        b"checkpoint",
        b"checkpoint",
        b"end",
    ]


async def test_a_worker_that_dies_after_a_rollback_is_resumed_from_its_latest_checkpoint(
    client: AnyRedis, ns: str
) -> None:
    """The consequence of issue 24 item 2 with a real worker process: its snapshot rolled back
    to an older checkpoint, the worker repairs it, then is SIGKILLed. The sweeper's StaleJob
    and the next attempt's ``resume_from`` carry the checkpoint the worker saw written (the
    rollback restores ``alive`` too: one script writes both)."""
    keys = KeySchema(ns).job("resumed")
    proc = spawn_ready(
        "tests.integration.checkpoint_proc", url_of(client), ns, "resumed", "1.0", stdin=True
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        older = await client.dump(keys.state)
        older_alive = await client.dump(keys.alive)  # restored with it, as a rollback does
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert await asyncio.to_thread(proc.stdout.readline) == "checkpointed\n"
        await client.restore(keys.state, 0, older, replace=True)
        await client.restore(keys.alive, 1_000, older_alive, replace=True)
        await eventually(lambda: _holds(client, keys.state, "checkpoint", b'{"row":500}'))
    finally:
        stop(proc)
    job = await _claim(Sweeper(client, namespace=ns))
    assert (job.job_id, job.checkpoint) == ("resumed", {"row": 500})
    async with heartbeat(client, "resumed", namespace=ns, interval=0.2, ttl=2) as hb:
        assert (hb.attempt, hb.resume_from) == (2, {"row": 500})


async def _holds(client: AnyRedis, key: str, field: str, value: bytes) -> bool:
    return bool(await client.hget(key, field) == value)


# -- 9. a final write retried after a new attempt (the proxy test is in test_replay.py) -----------


async def test_a_final_write_replayed_after_new_attempts_answers_already_ended(
    client: AnyRedis, ns: str
) -> None:
    """finish.lua run again after the job id was started again (and even ended again) answers
    "already ended": the end entry of its fence is in the stream. A worker whose job was taken
    from it without an end of its own is still told so."""
    keys = KeySchema(ns).job("fin")

    async def acquire(token: str) -> list[int]:
        reply = await evalsha(
            client, SCRIPTS.acquire, keys.all(), [token, 60_000, 100, "w", "", "", "", ""]
        )
        assert reply[0] == 1
        return [int(x) for x in reply[1:4]]

    def finish(token: str, fence: int, seq: int) -> calls.Call[calls.FinishCode]:
        return calls.finish(
            keys.all(),
            token=token,
            fence=fence,
            ttl_ms=60_000,
            seq=seq,
            status="COMPLETED",
            error="",
            maxlen=100,
            retention_ms=60_000,
            dynamic=["1", "1", "", "", "", "", "", "0"],
        )

    fence_a, _, seq_a = await acquire("tokA")
    a = finish("tokA", fence_a, seq_a + 1)
    assert await calls.run(client, a) is calls.FinishCode.WRITTEN
    fence_b, attempt_b, seq_b = await acquire("tokB")
    assert attempt_b == 2
    assert await calls.run(client, a) is calls.FinishCode.ALREADY_ENDED  # B is running
    assert await client.get(keys.alive) == f"tokB:{fence_b}:{seq_b}:0".encode()
    assert await calls.run(client, finish("tokB", fence_b, seq_b + 1)) is calls.FinishCode.WRITTEN
    assert await calls.run(client, a) is calls.FinishCode.ALREADY_ENDED  # B ended too
    await acquire("tokC")
    assert await calls.run(client, a) is calls.FinishCode.ALREADY_ENDED  # C is running

    # C's alive key expires and D starts: C never wrote an end, so it is taken over
    fence_c = int(await client.hget(keys.state, "fence"))
    await client.delete(keys.alive)
    await acquire("tokD")
    taken = await calls.run(client, finish("tokC", fence_c, 99))
    assert taken is calls.FinishCode.TAKEN_OVER
    assert await client.hget(keys.state, "status") == b"RUNNING"


async def test_many_jobs_enter_at_once_on_a_cluster_client_never_initialised(
    redis_cluster: LocalCluster, ns: str
) -> None:
    """A fresh ``RedisCluster`` learns its slots on its first commands; 12 jobs entering at once
    used to get ``JobBusy`` (a replayed acquire) or redis-py's own connection-setup error. Each
    job now starts, beats and ends COMPLETED, with no ``initialize()`` first."""
    client = RedisCluster.from_url(redis_cluster.url)
    try:

        async def one(i: int) -> int:
            async with heartbeat(client, f"fresh-{i}", namespace=ns, interval=0.1, ttl=2.0) as hb:
                hb.progress.advance()
            return hb.attempt

        assert await asyncio.gather(*(one(i) for i in range(12))) == [1] * 12
        reader = StatusReader(client, namespace=ns)
        states = {(await reader.get(f"fresh-{i}")).state for i in range(12)}
        assert states == {JobState.COMPLETED}
    finally:
        await client.aclose()
