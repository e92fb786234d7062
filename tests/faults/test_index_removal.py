"""The worker's conditional removal from the running-jobs index at the end of a job (issue 12,
item 6): it spares a new attempt's entry, and still drops its own after others moved it."""

from __future__ import annotations

import asyncio

from jobpulse import heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS, evalsha

from .conftest import Proxied

NS = "removal"


async def test_a_finishing_worker_spares_the_entry_a_new_attempt_enrolled_after_its_end(
    proxied: Proxied,
) -> None:
    """The final write runs, its reply is held back, and a new attempt enrolls the job before
    the worker's removal: the removal must leave the new entry."""
    schema = KeySchema(NS)
    shard, state = schema.index_for("race"), schema.state("race")
    direct = proxied.direct
    held = proxied.proxy.delay_reply_once(SCRIPTS.finish.sha.encode(), 1.0)
    enrolled: list[int] = []

    async def new_attempt() -> None:
        while await direct.hget(state, "status") != b"COMPLETED":
            await asyncio.sleep(0.01)
        enrolled.append(int(await evalsha(direct, SCRIPTS.enroll, (shard,), ["race", 60_000])))

    async with heartbeat(proxied.via_proxy, "race", namespace=NS, interval=0.1, ttl=2.0) as hb:
        hb.progress.advance()
        racer = asyncio.create_task(new_attempt())
    await racer
    assert held.is_set()  # the enroll landed while the final write's reply was held
    assert await direct.zscore(shard, "race") == enrolled[0]


async def test_a_job_whose_entry_a_sweeper_re_scored_still_leaves_the_index(
    proxied: Proxied,
) -> None:
    """A sweeper re-scores the entry of a live job whose index refresh is late; the worker never
    sees that write, yet its removal at the end drops the entry."""
    shard = KeySchema(NS).index_for("late")
    direct = proxied.direct
    async with heartbeat(proxied.via_proxy, "late", namespace=NS, interval=0.1, ttl=2.0) as hb:
        hb.progress.advance()
        later = int(await direct.zscore(shard, "late")) + 60_000
        await direct.zadd(shard, {"late": later}, xx=True, gt=True)  # the sweeper's re-score
    assert await direct.zscore(shard, "late") is None
