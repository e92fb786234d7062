"""Least privilege: worker, reader and sweeper run as a Redis user limited to the namespace's keys
and exactly the commands documented in docs/security.md."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from jobpulse import JobCancelled, JobState, StatusReader, Sweeper, heartbeat, request_cancel
from jobpulse._provision import RedisServer
from jobpulse.metrics import take_census

from ..support import spawn_worker, stop

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def documented_acl_rules() -> list[str]:
    """The ACL SETUSER rules exactly as docs/security.md prints them."""
    block = re.search(r"```text\n(ACL SETUSER .*?)```", DOC.read_text(), re.S)
    assert block is not None
    words = block.group(1).split()
    assert words[:4] == ["ACL", "SETUSER", "jobpulse", "on"]
    return [w if w != ">CHANGE-ME" else ">s3cret" for w in words[3:]]


@pytest.fixture
async def limited(private_redis: RedisServer) -> aioredis.Redis:
    admin = aioredis.Redis.from_url(private_redis.url)
    await admin.execute_command("ACL", "SETUSER", "jobpulse", *documented_acl_rules())
    await admin.aclose()
    client = aioredis.Redis(port=private_redis.port, username="jobpulse", password="s3cret")
    yield client  # type: ignore[misc]
    await client.aclose()


async def test_worker_reader_and_sweeper_run_with_the_documented_acl(
    limited: aioredis.Redis, private_redis: RedisServer
) -> None:
    port = private_redis.port
    async with StatusReader(limited) as reader:
        async with heartbeat(limited, "acl-job", interval=0.05, total=10) as hb:
            hb.set_stage("work")
            hb.progress.advance(4)
            await hb.checkpoint(at=4)
            status = await reader.get("acl-job")
            assert status.state is JobState.RUNNING
            events = []
            async for event in reader.watch("acl-job"):
                events.append(event.kind)
                if event.kind == "checkpoint":
                    break
        assert (await reader.wait("acl-job", timeout=10)).state is JobState.COMPLETED
        assert events[0] == "start"

        with pytest.raises(JobCancelled):
            async with heartbeat(limited, "acl-cancel", interval=0.05):
                assert await request_cancel(limited, "acl-cancel")
                await asyncio.sleep(10)

    # a worker process running as the limited user is SIGKILLed; a sweeper claims its job
    url = f"redis://jobpulse:s3cret@127.0.0.1:{port}/0"
    proc = spawn_worker(url, "jobpulse", "acl-dead", 0.6)
    stop(proc)  # SIGKILL: the worker dies with its lease held
    claimed: list[str] = []
    async with asyncio.timeout(30):
        while not claimed:
            claimed += [job.job_id for job in await Sweeper(limited).sweep()]
            await asyncio.sleep(0.2)
    assert claimed == ["acl-dead"]
    census = await take_census(limited)  # GET /metrics's census, with the same user
    assert [(k.kind, k.running, k.claims) for k in census.kinds] == [("", 0, 1)]


async def test_the_limited_user_cannot_touch_other_keys_or_commands(
    limited: aioredis.Redis,
) -> None:
    with pytest.raises(NoPermissionError):
        await limited.get("other:key")
    with pytest.raises(NoPermissionError):
        await limited.execute_command("FLUSHALL")
    with pytest.raises(NoPermissionError):
        await limited.execute_command("KEYS", "*")
