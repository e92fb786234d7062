"""arq integration: every job function runs under a jobpulse heartbeat.

Install it on the worker settings (``pip install "jobpulse[arq]"``)::

    from jobpulse.integrations.arq import instrument

    @instrument
    class WorkerSettings:
        functions = [report]

Each job then runs inside ``heartbeat(redis, job_id_for(ctx["job_id"]), kind=<function name>)``
(``jobpulse.current()`` is that heartbeat), and while the heartbeat lives the job's
``arq:in-progress:<job id>`` key is extended to ``ttl + interval`` seconds every ``interval``:
arq starts a job again once that key is gone, so a live job is never started twice and a dead
worker's job is started again about ``ttl + interval`` seconds after its worker died, whatever
``job_timeout`` is.

Cancel: arq's own ``Job.abort()`` cancels the task, which ends the jobpulse job CANCELLED, and arq
records its aborted result (``CancelledError``). ``jobpulse.request_cancel()`` cancels the body;
the job is then aborted through arq's own abort set, so arq records the same aborted result.
For that the settings get ``allow_abort_jobs = True`` unless they set it themselves.

Beats: arq runs only ``async def`` functions, in its event loop, so every job beats from that
loop (no sidecar: there is no task of arq's in a thread whose GIL hold could starve it). A job
that calls blocking code should hand it to a thread itself and keep the loop free; a body that
blocks the loop for longer than ``ttl`` is read STALE meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from arq.constants import abort_jobs_ss, in_progress_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Function, func

if TYPE_CHECKING:
    from arq.typing import WorkerCoroutine

from ..errors import JobCancelled
from ._common import WRAPPED, AsyncPulse, PulseOptions
from ._settle import SettledRun

__all__ = ["instrument", "instrument_function"]

S = TypeVar("S")

#: How long a job cancelled by ``request_cancel`` waits for arq to abort it before it fails
#: with ``JobCancelled`` instead (arq aborts at its next poll, every ``poll_delay`` seconds).
ABORT_WAIT = 10.0

# Keys of arq's per-job context: set by instrument()'s on_job_start hook (the after_job_end hook
# will come), and the run whose heartbeat end waits for that hook.
_HOOKED = "jobpulse_hooked"
_SETTLED = "jobpulse_settled"


def instrument_function(
    function: WorkerCoroutine | Function,
    options: PulseOptions,
    *,
    abort_via_arq: bool = True,
) -> Function:
    """One arq job function wrapped to run under a heartbeat (what :func:`instrument` applies to
    each entry of ``functions``). Name, timeout, ``keep_result`` and ``max_tries`` are kept.

    Args:
        function: a coroutine function or an ``arq.worker.Function`` (from ``arq.func``).
        options: the heartbeat options.
        abort_via_arq: a job cancelled by ``request_cancel`` is aborted through arq's abort set
            (needs ``allow_abort_jobs``); False raises ``JobCancelled`` out of it instead.
    """
    fn = func(function)
    if getattr(fn.coroutine, WRAPPED, False):
        return fn  # instrumented already: never two heartbeats for one job
    name = fn.name
    inner = fn.coroutine

    @functools.wraps(inner)
    async def run(ctx: dict[Any, Any], *args: Any, **kwargs: Any) -> Any:
        queue = ctx["redis"]
        job_id: str = ctx["job_id"]
        claim_ms = int(options.claim_ttl * 1000)
        key = in_progress_key_prefix + job_id

        async def refresh() -> None:
            # PEXPIRE never creates the key: once arq deleted it at the end, this is a no-op.
            await queue.pexpire(key, claim_ms)

        async def body(hb: AsyncPulse) -> Any:
            return await inner(ctx, *args, **kwargs)

        hooked = bool(ctx.get(_HOOKED))
        run = SettledRun(
            options, queue, job_id, name, refresh, body, settle=hooked, wait=options.ttl
        )
        ctx[_SETTLED] = run
        try:
            return await run.result()
        except JobCancelled:
            if not abort_via_arq:
                raise
        # Cancelled on request: let arq abort the job (it cancels this task at its next poll),
        # so arq records its own aborted result.
        await queue.zadd(abort_jobs_ss, {job_id: timestamp_ms()})
        await asyncio.sleep(ABORT_WAIT)
        raise JobCancelled(f"job {job_id!r} was cancelled on request")

    setattr(run, WRAPPED, True)
    return Function(name, run, fn.timeout_s, fn.keep_result_s, fn.keep_result_forever, fn.max_tries)


def instrument(
    settings: S,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
) -> S:
    """Instrument arq worker settings: every function in ``functions`` runs under a heartbeat.

    Use it as a class decorator (``@instrument``) or call it
    (``WorkerSettings = instrument(WorkerSettings, ttl=10)``); a settings ``dict`` is returned as
    a new dict. ``allow_abort_jobs`` is set to True unless the settings set it. ``cron_jobs`` are
    not instrumented. An ``on_job_start`` and an ``after_job_end`` hook are called before the
    settings' own: the heartbeat's end is written after arq stored the job's result.

    Args:
        settings: an arq ``WorkerSettings`` class or dict.
        interval: seconds between beats and between refreshes of the in-progress key.
        ttl: the heartbeat's lease time; the in-progress key is kept at ``ttl + interval``.
        namespace: jobpulse's key prefix.
        redis: the ``redis.asyncio`` client for jobpulse; None uses arq's own connection.

    Returns:
        The settings, instrumented.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(interval=interval, ttl=ttl, namespace=namespace, redis=redis)
    values: dict[str, Any] = dict(settings if isinstance(settings, dict) else vars(settings))
    abort = values.get("allow_abort_jobs", True)
    functions: Sequence[Any] = values.get("functions", ())
    changes = {
        "functions": [instrument_function(f, options, abort_via_arq=abort) for f in functions],
        "allow_abort_jobs": abort,
        "on_job_start": _before(_mark_hooked, values.get("on_job_start")),
        "after_job_end": _before(_end_after_arq, values.get("after_job_end")),
    }
    if isinstance(settings, dict):
        return {**settings, **changes}  # type: ignore[return-value]
    for name, value in changes.items():
        setattr(settings, name, value)
    return settings


def _before(ours: Callable[[dict[Any, Any]], Awaitable[None]], theirs: Any) -> Any:
    """arq's hook setting (one coroutine function or None) with ours called first."""
    if theirs is None or getattr(theirs, WRAPPED, False):
        return ours if theirs is None else theirs

    async def both(ctx: dict[Any, Any]) -> None:
        await ours(ctx)
        await theirs(ctx)

    setattr(both, WRAPPED, True)
    return both


async def _mark_hooked(ctx: dict[Any, Any]) -> None:
    """on_job_start: the job's heartbeat end may wait for arq's result (the hook below)."""
    ctx[_HOOKED] = True


async def _end_after_arq(ctx: dict[Any, Any]) -> None:
    """after_job_end (arq has stored the result, or scheduled the retry): write the heartbeat's
    end now."""
    run = ctx.pop(_SETTLED, None)
    if run is not None:
        await run.finished()


setattr(_mark_hooked, WRAPPED, True)
setattr(_end_after_arq, WRAPPED, True)
