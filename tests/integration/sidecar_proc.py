"""Worker processes whose job is beaten by the sidecar helper (tests/integration/test_sidecar.py):
``python -m tests.integration.sidecar_proc SCENARIO SHELL URL NS JOB TTL`` (SHELL: sync or
asyncio). Every scenario prints ``ready <pid> <helper pid>`` once the lease is held.

* ``gil``: the body holds the GIL (and, in the asyncio shell, its event loop) for 3 x ttl of
  wall time (:func:`hold_gil`), then counts one item and ends; prints ``held <seconds>`` and
  ``ok``.
* ``forever``: counts items until SIGKILLed (the owner-death test).
* ``helper-dies``: works until the job must stop (the test SIGKILLs the helper); prints the
  exception the block raised (``lost <cause>``), then runs a second job to its end on a new
  helper and prints ``second <helper pid>``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync
from jobpulse import LeaseLost


def hold_gil(seconds: float) -> float:
    """Hold the GIL (and, in the asyncio shell, the event loop) for ``seconds`` of wall time;
    returns how long it was held. With a switch interval longer than the hold, a thread waiting
    for the GIL never asks this one to drop it, and a loop that calls nothing blocking keeps it
    throughout: held by the clock, not by a calibrated ``sum(range(n))`` (whose ``n`` came out
    short when the machine's load fell between the calibration and the call)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 5.0)
    try:
        started = time.perf_counter()
        end = started + seconds
        while time.perf_counter() < end:
            pass
        return time.perf_counter() - started
    finally:
        sys.setswitchinterval(before)


def say(*words: object) -> None:
    print(*words, flush=True)


def gil_sync(client: redis.Redis, ns: str, job_id: str, ttl: float) -> None:
    with jobpulse.sync.heartbeat(
        client, job_id, namespace=ns, ttl=ttl, interval=ttl / 4, total=1
    ) as hb:
        say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
        say("held", hold_gil(3 * ttl))
        hb.progress.advance()
    say("ok")


async def gil_asyncio(client: aioredis.Redis, ns: str, job_id: str, ttl: float) -> None:
    async with jobpulse.heartbeat(
        client, job_id, namespace=ns, ttl=ttl, interval=ttl / 4, total=1, sidecar=True
    ) as hb:
        say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
        say("held", hold_gil(3 * ttl))  # in the loop's thread: the event loop is held too
        hb.progress.advance()
        await asyncio.sleep(0)
    say("ok")


def forever_sync(client: redis.Redis, ns: str, job_id: str, ttl: float) -> None:
    with jobpulse.sync.heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
        while True:
            hb.progress.advance()
            time.sleep(0.01)


async def forever_asyncio(client: aioredis.Redis, ns: str, job_id: str, ttl: float) -> None:
    async with jobpulse.heartbeat(
        client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6, sidecar=True
    ) as hb:
        say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
        while True:
            hb.progress.advance()
            await asyncio.sleep(0.01)


def helper_dies_sync(client: redis.Redis, ns: str, job_id: str, ttl: float) -> None:
    try:
        with jobpulse.sync.heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
            say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
            while not hb.cancelled:
                hb.progress.advance()
                time.sleep(0.01)
    except LeaseLost as exc:
        say("lost", exc.cause.name)
    with jobpulse.sync.heartbeat(
        client, job_id + "-2", namespace=ns, ttl=ttl, interval=ttl / 6
    ) as hb:
        pid = hb.helper_pid  # type: ignore[union-attr]
    say("second", pid)


async def helper_dies_asyncio(client: aioredis.Redis, ns: str, job_id: str, ttl: float) -> None:
    try:
        async with jobpulse.heartbeat(
            client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6, sidecar=True
        ) as hb:
            say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
            while True:  # cancelled by the heartbeat once the helper is gone
                hb.progress.advance()
                await asyncio.sleep(0.01)
    except LeaseLost as exc:
        say("lost", exc.cause.name)
    async with jobpulse.heartbeat(
        client, job_id + "-2", namespace=ns, ttl=ttl, interval=ttl / 6, sidecar=True
    ) as hb:
        pid = hb.helper_pid  # type: ignore[union-attr]
    say("second", pid)


def group_term_sync(client: redis.Redis, ns: str, job_id: str, ttl: float) -> None:
    """Works until SIGTERM (sent to the whole process group, helper included), then ends the
    job normally: its final write needs the helper to have outlived the signal."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with jobpulse.sync.heartbeat(client, job_id, namespace=ns, ttl=ttl, interval=ttl / 6) as hb:
        say("ready", os.getpid(), hb.helper_pid)  # type: ignore[union-attr]
        while not stopping.wait(0.01):
            hb.progress.advance()
    say("ok")


def main(scenario: str, shell: str, url: str, ns: str, job_id: str, ttl: float) -> None:
    if shell == "sync":
        sync_client = redis.Redis.from_url(url, socket_timeout=ttl / 2)
        runs: dict[str, Any] = {"gil": gil_sync, "forever": forever_sync}
        runs["helper-dies"] = helper_dies_sync
        runs["group-term"] = group_term_sync
        runs[scenario](sync_client, ns, job_id, ttl)
        return

    async def run() -> None:
        client = aioredis.Redis.from_url(url)
        runs: dict[str, Any] = {"gil": gil_asyncio, "forever": forever_asyncio}
        runs["helper-dies"] = helper_dies_asyncio
        await runs[scenario](client, ns, job_id, ttl)

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:6], float(sys.argv[6]))
