"""The twin guard: the asyncio shell (``jobpulse.heartbeat``) and the thread shell
(``jobpulse.sync.heartbeat``) must not drift apart.

Both drive one core (``BeatMachine``, the step sequences of ``_worker/life.py``, the shared
``Shell``); this file fails when their public members differ beyond the documented differences,
or when a scenario of the table (stolen lease, cancel, Redis down past ttl, crash in the body, a
plain run) ends differently in the two. The late-beat scenario needs a frozen process of each
shell: ``test_late_wake.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from jobpulse import JobCancelled, LeaseLost, request_cancel
from jobpulse._protocol.keys import KeySchema
from jobpulse._worker.heartbeat import JobHeartbeat
from jobpulse._worker.sync_heartbeat import SyncHeartbeat

from .conftest import Proxied
from .test_shells import SHELLS, run_job

# What only one shell has, and why (docs/sync.md): a blocking checkpoint takes a timeout.
ONLY_SYNC: set[str] = set()
EXTRA_PARAMETERS = {"checkpoint": {"timeout"}}


def _public(cls: type) -> dict[str, Any]:
    return {
        name: inspect.getattr_static(cls, name) for name in dir(cls) if not name.startswith("_")
    }


def test_the_shells_have_the_same_public_members() -> None:
    asyncio_shell, thread_shell = _public(JobHeartbeat), _public(SyncHeartbeat)
    assert set(thread_shell) - set(asyncio_shell) == ONLY_SYNC
    assert set(asyncio_shell) - set(thread_shell) == set()
    for name, member in asyncio_shell.items():
        twin = thread_shell[name]
        assert type(member) is type(twin), name  # a property in one is a property in the other
        if callable(member):
            mine = set(inspect.signature(member).parameters)
            theirs = set(inspect.signature(twin).parameters)
            assert theirs - mine == EXTRA_PARAMETERS.get(name, set()), name
            assert mine <= theirs, name


@dataclass(frozen=True)
class Outcome:
    status: bytes | None  # the snapshot's status once the job is over
    raised: str  # the exception type that left the block ("" for none)
    cause: str  # LeaseLost's cause ("" otherwise)


async def _outcome(job: asyncio.Task[Any], proxied: Proxied, job_id: str) -> Outcome:
    raised, cause = "", ""
    try:
        await job
    except Exception as exc:
        raised = type(exc).__name__
        cause = exc.cause.name if isinstance(exc, LeaseLost) else ""
    proxied.proxy.blackhole = False
    status = await proxied.direct.hget(KeySchema("jobpulse").job(job_id).state, "status")
    return Outcome(status, raised, cause)


async def _stoppable(shell: str, proxied: Proxied, **options: Any) -> asyncio.Task[Any]:
    """A job (named after the shell) whose body waits until its heartbeat says stop, then
    checks; returned once the body runs."""
    started = threading.Event()

    def body(hb: Any) -> None:
        started.set()
        while not hb.cancelled:
            time.sleep(0.01)
        hb.check()

    job = asyncio.create_task(run_job(shell, proxied.proxy.url, shell, body, **options))
    await asyncio.to_thread(started.wait, 10)
    return job


async def _completes(shell: str, proxied: Proxied) -> Outcome:
    job = asyncio.create_task(run_job(shell, proxied.proxy.url, shell, lambda hb: None))
    return await _outcome(job, proxied, shell)


async def _crash_in_the_body(shell: str, proxied: Proxied) -> Outcome:
    def body(hb: Any) -> None:
        raise ValueError("bad input")

    job = asyncio.create_task(run_job(shell, proxied.proxy.url, shell, body))
    return await _outcome(job, proxied, shell)


async def _stolen_lease(shell: str, proxied: Proxied) -> Outcome:
    job = await _stoppable(shell, proxied, interval=0.05, ttl=1.0)
    await proxied.direct.set(KeySchema("jobpulse").job(shell).alive, "thief:1", px=5000)
    return await _outcome(job, proxied, shell)


async def _cancel_request(shell: str, proxied: Proxied) -> Outcome:
    job = await _stoppable(shell, proxied, interval=0.05, ttl=1.0)
    assert await request_cancel(proxied.direct, shell) is True
    return await _outcome(job, proxied, shell)


async def _redis_down_past_ttl(shell: str, proxied: Proxied) -> Outcome:
    job = await _stoppable(shell, proxied, interval=0.1, ttl=1.0)
    proxied.proxy.blackhole = True  # until the job is over: the LOST record cannot land
    return await _outcome(job, proxied, shell)


SCENARIOS: dict[str, tuple[Callable[[str, Proxied], Any], Outcome]] = {
    "completes": (_completes, Outcome(b"COMPLETED", "", "")),
    "crash in the body": (_crash_in_the_body, Outcome(b"FAILED", "ValueError", "")),
    "stolen lease": (_stolen_lease, Outcome(b"RUNNING", "LeaseLost", "TAKEN_OVER")),
    "cancel request": (_cancel_request, Outcome(b"CANCELLED", JobCancelled.__name__, "")),
    "Redis down past ttl": (_redis_down_past_ttl, Outcome(b"RUNNING", "LeaseLost", "EXPIRED")),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_both_shells_end_a_scenario_alike(scenario: str, proxied: Proxied) -> None:
    """Each shell runs the scenario on a job of its own (named after the shell), one after the
    other behind the same proxy; both must end as the table says."""
    run, expected = SCENARIOS[scenario]
    outcomes = {shell: await run(shell, proxied) for shell in SHELLS}
    assert outcomes == {shell: expected for shell in SHELLS}
