"""WORKER_STATS counts what this process's heartbeats did: beats, failed beats while Redis does
not answer, lease losses by cause, unwritten final states, loop lag (private Redis, fault proxy)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from jobpulse import LeaseLost, StateNotWritten, Sweeper, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse.metrics import worker_stats

from ..support import eventually
from .conftest import Proxied


def snapshot() -> dict[str, object]:
    stats = worker_stats()
    out = dataclasses.asdict(stats)
    out["lease_losses"] = dict(stats.lease_losses)
    return out


async def test_beats_failures_and_loop_lag_are_counted(proxied: Proxied) -> None:
    before = snapshot()
    async with heartbeat(proxied.via_proxy, "counted", interval=0.1, ttl=3.0):
        await eventually(lambda: _more(before, "beats", 5), within=10)
        proxied.proxy.blackhole = True
        await eventually(lambda: _more(before, "beat_failures", 1), within=10)
        proxied.proxy.blackhole = False
    after = snapshot()
    assert after["loop_lag_count"] > before["loop_lag_count"]  # type: ignore[operator]
    assert after["final_writes_failed"] == before["final_writes_failed"]


async def test_an_unwritten_final_state_is_counted(proxied: Proxied) -> None:
    before = snapshot()["final_writes_failed"]
    with pytest.raises(StateNotWritten):
        async with heartbeat(proxied.via_proxy, "unwritten", ttl=30, final_timeout=0.5):
            proxied.proxy.blackhole = True
    proxied.proxy.blackhole = False
    assert worker_stats().final_writes_failed == before + 1  # type: ignore[operator]


async def test_a_lease_lost_to_a_sweepers_claim_is_counted_as_fenced_out(
    proxied: Proxied,
) -> None:
    before = worker_stats().lease_losses.get("fenced_out", 0)
    keys = KeySchema().job("claimed")
    with pytest.raises(LeaseLost):
        async with heartbeat(proxied.via_proxy, "claimed", interval=0.2, ttl=3.0):
            # the worker looks dead to a sweeper (its keys are gone), but still runs
            proxied.proxy.blackhole = True
            await proxied.direct.delete(keys.alive)
            await proxied.direct.zadd(KeySchema().index(0), {"claimed": 0})
            assert [j.job_id for j in await Sweeper(proxied.direct).sweep()] == ["claimed"]
            proxied.proxy.blackhole = False
            await asyncio.sleep(10)  # the next beat is refused: the body is cancelled
    assert worker_stats().lease_losses.get("fenced_out", 0) == before + 1


async def _more(before: dict[str, object], name: str, n: int) -> bool:
    return getattr(worker_stats(), name) >= before[name] + n  # type: ignore[operator]
