"""SAQ integration: every job function runs under a jobpulse heartbeat.

Install it on the worker settings (``pip install "jobpulse[saq]"``)::

    from jobpulse.integrations.saq import instrument

    settings = instrument({"queue": queue, "functions": [report]})

Each job then runs inside ``heartbeat(redis, job_id_for(job.id), kind=<function name>)``
(``jobpulse.current()`` is that heartbeat), and while the heartbeat lives the job's ``touched``
time is refreshed every ``interval`` seconds: SAQ's sweep treats an ACTIVE job untouched for its
``heartbeat`` seconds as stuck (aborts and retries it), so a live job is never swept, and a job
can be enqueued with a short ``heartbeat`` so a dead worker's job is swept soon.

A plain ``def`` function (SAQ runs it in a thread) beats from jobpulse's sidecar helper process
(``sidecar=True``, the default), which also refreshes the job's ``touched`` time: a body holding
the GIL stops this worker's event loop, but not the helper.

Cancel: SAQ's own ``job.abort()`` cancels the task, which ends the jobpulse job CANCELLED, and
SAQ records ABORTED. ``jobpulse.request_cancel()`` cancels the body; the job is then aborted
through SAQ's own abort, so SAQ records ABORTED too.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import WatchError
from saq.job import Job, Status
from saq.queue.redis import RedisQueue
from saq.utils import now

from ..errors import JobCancelled
from ._common import WRAPPED, AsyncPulse, HelperClaim, PulseOptions, job_id_for, run_in_thread
from ._settle import SettledRun

__all__ = ["instrument", "instrument_function"]

S = TypeVar("S")

#: How long a job cancelled by ``request_cancel`` waits for SAQ to abort it before it fails with
#: ``JobCancelled`` instead (SAQ's worker looks for aborted jobs every ``timers["abort"]`` s).
ABORT_WAIT = 10.0

#: The error text SAQ records for a job aborted because of ``request_cancel``.
ABORT_ERROR = "cancelled by jobpulse.request_cancel"

# Keys of SAQ's per-job context: set by instrument()'s before_process hook (the after_process
# hook will come), and the run whose heartbeat end waits for that hook.
_HOOKED = "jobpulse_hooked"
_SETTLED = "jobpulse_settled"


def instrument_function(
    function: Callable[..., Any] | tuple[str, Callable[..., Any]], options: PulseOptions
) -> tuple[str, Callable[..., Any]]:
    """One SAQ job function wrapped to run under a heartbeat (what :func:`instrument` applies to
    each entry of ``functions``). Returns ``(name, wrapped)``, the name SAQ would have used.

    A plain ``def`` function runs in a thread, as SAQ runs it, with ``jobpulse.current()``
    visible in it; a thread cannot be cancelled, so on cancel the job waits for it to return
    (have it call ``jobpulse.current().progress.check()`` to stop promptly).
    """
    name, fn = function if isinstance(function, tuple) else (function.__qualname__, function)
    if getattr(fn, WRAPPED, False):
        return name, fn  # instrumented already: never two heartbeats for one job
    is_async = asyncio.iscoroutinefunction(fn)

    @functools.wraps(fn)
    async def run(ctx: dict[str, Any], **kwargs: Any) -> Any:
        job: Job = ctx["job"]
        queue = job.get_queue()
        redis = queue.redis if isinstance(queue, RedisQueue) else None
        if redis is None and options.redis is None:
            raise TypeError("jobpulse.integrations.saq needs redis= for a queue other than Redis")

        async def refresh() -> None:
            await _touch(queue, job)

        async def body(hb: AsyncPulse) -> Any:
            if is_async:
                return await fn(ctx, **kwargs)
            return await run_in_thread(fn, ctx, **kwargs)

        sidecar = options.sidecar and not is_async  # a thread's GIL hold starves the loop
        claim = _helper_claim(queue, job, options.interval) if sidecar else None
        hooked = bool(ctx.get(_HOOKED))
        run = SettledRun(
            options,
            redis,
            job.id,
            name,
            refresh,
            body,
            settle=hooked,
            wait=options.ttl,
            sidecar=sidecar,
            claim=claim,
        )
        ctx[_SETTLED] = run
        try:
            return await run.result()
        except JobCancelled:
            pass
        # Cancelled on request: abort through SAQ (its worker cancels this task within
        # timers["abort"] seconds), so SAQ records its own ABORTED outcome.
        await job.abort(ABORT_ERROR)
        await asyncio.sleep(ABORT_WAIT)
        raise JobCancelled(f"job {job.id!r} was cancelled on request")

    setattr(run, WRAPPED, True)
    return name, run


async def _touch(queue: Any, job: Job) -> None:
    """Refresh the stored job's ``touched`` time, only while it is ACTIVE.

    SAQ's own ``job.update()`` reads the status and writes the whole job in two steps, so it can
    overwrite an ABORTING status written in between; this does the same write under WATCH and
    leaves a job that is no longer ACTIVE (aborting, finished) alone.
    """
    if not isinstance(queue, RedisQueue):
        await job.update()
        return
    async with queue.redis.pipeline(transaction=True) as pipe:
        await pipe.watch(job.id)
        stored = queue.deserialize(await pipe.get(job.id))
        if stored is None or stored.status != Status.ACTIVE:
            return
        job.touched = now()
        job.status = stored.status
        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.set(job.id, queue.serialize(job))
        try:
            await pipe.execute()
        except WatchError:
            return  # the job changed meanwhile (an abort?): the next refresh looks again


def _helper_claim(queue: Any, job: Job, period: float) -> HelperClaim | None:
    """The refresh of the job's ``touched`` time for the sidecar helper (a ``def`` job: its
    thread's GIL hold stops this loop, and the refresh with it), or None when the helper cannot
    run it (not a Redis queue, a client it cannot rebuild, a ``dump``/``load`` that does not
    pickle): then the loop refreshes it, as for ``async def`` jobs."""
    if not isinstance(queue, RedisQueue):
        return None
    touch = functools.partial(_touch_stored, job.id, queue._dump, queue._load)
    try:
        pickle.dumps(touch)
    except Exception:
        return None
    return HelperClaim.of(queue.redis, touch, period, job_id_for(job.id))


def _touch_stored(key: str, dump: Any, load: Any, client: Any) -> None:
    """(In the sidecar helper, with its blocking client) :func:`_touch` on the stored job: its
    ``touched`` time set to now, under WATCH, only while its status is ``active`` (the record is
    SAQ's ``Job.to_dict()`` written with the queue's ``dump``; nothing else in it changes)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(key)
        raw = pipe.get(key)
        stored = load(raw) if raw else None
        if not isinstance(stored, dict) or stored.get("status") != Status.ACTIVE:
            return
        stored["touched"] = int(time.time() * 1000)  # saq.utils.now()
        pipe.multi()
        pipe.set(key, dump(stored))
        try:
            pipe.execute()
        except WatchError:
            return  # the job changed meanwhile (an abort?): the next refresh looks again


def instrument(
    settings: S,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
    sidecar: bool = True,
) -> S:
    """Instrument SAQ worker settings: every function in ``functions`` runs under a heartbeat.

    Returns a new settings dict (``saq module.settings`` and ``Worker(**settings)`` take it
    as before). ``cron_jobs`` are not instrumented. A ``before_process`` and an
    ``after_process`` hook are put before the settings' own: the heartbeat's end is written
    after SAQ stored the job's outcome.

    Args:
        settings: SAQ settings (a dict with ``queue`` and ``functions``).
        interval: seconds between beats and between refreshes of the job's ``touched`` time.
        ttl: the heartbeat's lease time.
        namespace: jobpulse's key prefix.
        redis: the ``redis.asyncio`` client for jobpulse; None uses the Redis queue's client.
        sidecar: True (the default): a plain ``def`` function (SAQ runs it in a thread) gets its
            beats, and its ``touched`` refresh, from jobpulse's helper process, so a body that
            holds the GIL delays neither; ``async def`` functions beat from the loop whatever
            this says. False: every job beats from the loop. With True, ``redis`` must be a
            client jobpulse can rebuild there (a plain ``redis.asyncio.Redis``; TypeError here
            otherwise).

    Returns:
        The settings, instrumented.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
    if not isinstance(settings, dict):
        raise TypeError(f"settings must be a SAQ settings dict, got {type(settings).__name__}")
    functions = [instrument_function(f, options) for f in settings["functions"]]
    before = _first(_mark_hooked, settings.get("before_process"))
    after = _first(_end_after_saq, settings.get("after_process"))
    instrumented = {**settings, "functions": functions}
    instrumented.update(before_process=before, after_process=after)
    return instrumented  # type: ignore[return-value]


def _first(ours: Callable[..., Any], theirs: Any) -> list[Callable[..., Any]]:
    """SAQ's hook setting (None, one function or several) with ours first, once."""
    hooks = [] if theirs is None else [theirs] if callable(theirs) else list(theirs)
    return hooks if ours in hooks else [ours, *hooks]


async def _mark_hooked(ctx: dict[str, Any]) -> None:
    """before_process: the job's heartbeat end may wait for SAQ's outcome (the hook below)."""
    ctx[_HOOKED] = True


async def _end_after_saq(ctx: dict[str, Any]) -> None:
    """after_process (SAQ has stored the job's outcome: finish, retry or abort): write the
    heartbeat's end now."""
    run = ctx.pop(_SETTLED, None)
    if run is not None:
        await run.finished()
