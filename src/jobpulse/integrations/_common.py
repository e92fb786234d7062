"""What every queue integration shares: id and kind mapping, options, the claim keeper.

A queue integration runs each task as::

    async with pulse(options, redis, queue_job_id, task_name, refresh) as hb:
        ... the task body (``jobpulse.current()`` is ``hb``) ...

``pulse`` enters ``heartbeat()`` keyed by :func:`job_id_for` of the queue's own id with
``kind=kind_for(task_name)``, and while the heartbeat lives it calls ``refresh()`` (the queue's
"I still hold this job" write: an in-progress key's TTL, a job's touch time, a stream entry's idle
time) at once and then every ``interval`` seconds.

Invariants:
  * the queue's claim is refreshed only while this worker holds the job's jobpulse lease: the
    keeper lives inside the ``async with heartbeat`` and, in both shells, asks the heartbeat's
    ``lease_held`` before each refresh (:class:`ClaimHold`); once the lease is lost it stops for
    good, so an orphaned body (a thread that outlives ``LeaseLost``) never keeps the claim of a
    job another attempt owns, and a claim outlives a dead worker by at most ``claim_ttl`` seconds;
  * a lease held by another attempt is waited for only while that holder is not alive
    (:func:`holder_alive`, both shells): a duplicate delivery of a live job raises ``JobBusy``
    before its body runs, even when the live run ends while it looks;
  * a failing refresh never stops the task: it is logged (rate-limited) and tried again next
    period — the heartbeat's own lease rules decide when a job must stop;
  * the task's return value and exceptions pass through unchanged (only what the heartbeat itself
    raises — ``JobCancelled``, ``LeaseLost`` — is added; each integration says what its queue
    records for those).

The pure parts (mapping, options, :func:`refresh_delays`) are shared by both kinds of queue:
:func:`keep_claim` and :func:`pulse` are the asyncio ones, :func:`keep_claim_sync` and
:func:`pulse_sync` (a refresher thread beside a ``jobpulse.sync`` heartbeat) serve the
synchronous queues (Celery, RQ, Dramatiq) under the same invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import logging
import pickle
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis as redis_sync

from .._protocol.errors import is_redis_fault
from .._protocol.keys import check_namespace
from .._protocol.ratelimit import RateLimitedLog
from .._protocol.rebuild import RedisFactory, checked_factory, factory_of
from .._reader.reader import StatusReader
from .._reader.status import JobState, JobStatus
from .._reader.sync_reader import SyncStatusReader
from .._worker.config import MAX_KIND_CHARS, HeartbeatConfig
from .._worker.current import current
from .._worker.heartbeat import JobHeartbeat, heartbeat
from .._worker.retry import retry_after
from .._worker.sidecar.job import AsyncSidecarHeartbeat, SidecarHeartbeat
from .._worker.sync_heartbeat import SyncHeartbeat
from .._worker.sync_heartbeat import heartbeat as sync_heartbeat
from ..errors import JobBusy, JobCancelled

__all__ = [
    "WRAPPED",
    "AsyncPulse",
    "ClaimHold",
    "ClaimPlan",
    "HelperClaim",
    "HolderView",
    "PulseOptions",
    "hold_back",
    "holder_alive",
    "job_id_for",
    "keep_claim",
    "keep_claim_sync",
    "kind_for",
    "leave_recorded",
    "plan_claim",
    "pulse",
    "pulse_sync",
    "refresh_delays",
    "run_in_thread",
]

log = logging.getLogger("jobpulse.integrations")

_ID_OK = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._\-:/]")
_READABLE = 100  # characters of the original id kept in a mapped id
_DIGEST = 16  # hex characters of sha256 in a mapped id (64 bits)

#: What an asyncio integration's task body is given: the in-loop heartbeat, or (a task run in
#: a thread, with ``sidecar``) the helper-beaten one; both have a heartbeat's public members.
AsyncPulse = JobHeartbeat | AsyncSidecarHeartbeat

#: The attribute that marks a task function an integration has wrapped (wrapping is idempotent).
WRAPPED = "__jobpulse_wrapped__"


def job_id_for(queue_id: str | bytes) -> str:
    """The jobpulse job id of a queue's job id.

    An id that already follows jobpulse's rules (1 to 200 characters of
    ``A-Z a-z 0-9 . _ - : /``) is used as it is, so ``StatusReader.get(queue_id)`` just works for
    the ids queues generate (uuid4 hex, ``arq:…``, ``saq:job:…``). Any other id is mapped
    deterministically to ``<readable>.h<digest>``: the first 100 characters of the id with
    every character outside those rules replaced by ``_``, then ``.h`` and the first 16 hex
    digits of the SHA-256 of the id's UTF-8 bytes. Example:
    ``job_id_for("report 7")`` is ``"report_7.h"`` followed by 16 hex digits. Call it to find
    a mapped job from outside the worker.

    Args:
        queue_id: the queue's job id (``bytes`` are decoded as UTF-8).

    Returns:
        A valid jobpulse job id.
    """
    text = queue_id.decode("utf-8", "surrogateescape") if isinstance(queue_id, bytes) else queue_id
    if _ID_OK.fullmatch(text) is not None:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    readable = _BAD_CHAR.sub("_", text[:_READABLE])
    return f"{readable}.h{digest}"


def kind_for(name: str) -> str:
    """The jobpulse ``kind`` of a task name: the name when it follows the kind rules, else the
    name with each character outside ``A-Z a-z 0-9 . _ - : /`` replaced by ``_``, cut to 100
    characters (a task name is already low-cardinality; no digest is needed)."""
    return _BAD_CHAR.sub("_", name)[:MAX_KIND_CHARS]


@dataclass(frozen=True, slots=True, kw_only=True)
class PulseOptions:
    """How an integration runs each task's heartbeat. Checked on construction, so a bad value
    fails when the integration is installed, before any Redis command.

    Attributes:
        interval: seconds between beats, and between refreshes of the queue's claim (> 0).
        ttl: the heartbeat's lease and liveness time (>= 2 * interval): a dead worker's job is
            STALE after at most ``ttl`` seconds.
        namespace: jobpulse's key prefix.
        redis: the ``redis.asyncio`` client jobpulse writes to; None (the default) uses the
            queue's own connection.
        sidecar: send each task's beats, and refresh the queue's claim, from jobpulse's
            helper process (``heartbeat(..., sidecar=True)``), so a body that holds the GIL
            delays neither: every task of the sync integrations (Celery, RQ, Dramatiq), and
            the tasks the asyncio integrations run in threads (taskiq's and SAQ's plain
            ``def`` tasks; coroutines keep in-loop beats). Their ``instrument()`` defaults to
            True.
    """

    interval: float = 1.0
    ttl: float = 6.0
    namespace: str = "jobpulse"
    redis: Any = None
    sidecar: bool = False

    def __post_init__(self) -> None:
        HeartbeatConfig(interval=self.interval, ttl=self.ttl)
        check_namespace(self.namespace)
        if not isinstance(self.sidecar, bool):
            raise TypeError(f"sidecar must be a bool, got {type(self.sidecar).__name__}")
        if self.sidecar and self.redis is not None:
            checked_factory(None, self.redis)  # TypeError now, not at the first task

    @property
    def claim_ttl(self) -> float:
        """Seconds each refresh extends the queue's claim by: ``ttl + interval``.

        One interval longer than the lease, so when a worker dies its jobpulse lease is gone
        before the queue hands the job to another worker, and the next attempt takes the job over
        (``resume_from``) instead of meeting a still-valid lease.
        """
        return self.ttl + self.interval


def refresh_delays(period: float) -> Iterator[float]:
    """The keeper's schedule: refresh at once, then every ``period`` seconds."""
    yield 0.0
    while True:
        yield period


@dataclass(slots=True)
class ClaimHold:
    """Whether a claim keeper may still refresh the queue's claim: the one rule of both shells.

    :meth:`ask` takes the heartbeat's ``lease_held`` before each refresh; once it was False the
    answer stays False (a lease lost, or past its deadline, is never refreshed on: another
    attempt may own the job by now).
    """

    holding: bool = True

    def ask(self, lease_held: bool) -> bool:
        """True when this refresh may go out."""
        self.holding = self.holding and lease_held
        return self.holding


R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class ClaimPlan(Generic[R]):
    """Who refreshes the queue's claim, and when (:func:`plan_claim`).

    Attributes:
        keeper: the refresh sent to the sidecar's helper with the job, or None.
        entering: the refresh this process runs while the heartbeat is entered (the helper
            starting, the lease acquired), or None.
        running: the refresh this process runs while the body runs, or None.
    """

    keeper: HelperClaim | None
    entering: R | None
    running: R | None


def plan_claim(refresh: R | None, claim: HelperClaim | None, *, sidecar: bool) -> ClaimPlan[R]:
    """Who keeps the queue's claim fresh: the one decision of :func:`pulse` and :func:`pulse_sync`.

    With ``sidecar`` and a ``claim`` the helper refreshes the claim beside the beats once the
    heartbeat is entered, and until then ``refresh`` runs in this process: the claim is never
    left without a refresh between the queue's hand-over and the helper's first one (a helper
    can take seconds to start on a loaded machine). Otherwise ``refresh`` runs in this process
    while the body runs (the heartbeat's entry is short: one acquire).
    """
    if sidecar and claim is not None:
        return ClaimPlan(keeper=claim, entering=refresh, running=None)
    return ClaimPlan(keeper=None, entering=None, running=refresh)


@dataclass(frozen=True, slots=True)
class HolderView:
    """What a duplicate attempt sees of the attempt that holds the job's lease: the snapshot's
    state (the reader's verdict), fence and last beat time (server ms)."""

    state: JobState
    fence: int | None
    heartbeat_ms: int | None

    @classmethod
    def of(cls, status: JobStatus) -> HolderView:
        return cls(status.state, status.fence, status.heartbeat_ms)


#: States only a live holder writes: its own end (a dead holder writes none).
_ENDED_BY_HOLDER = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


def holder_alive(first: HolderView, now: HolderView) -> bool:
    """Is the holder that refused our acquire alive? ``first`` is what was read after the first
    refusal, ``now`` what was read after the latest.

    Alive: it wrote its end (COMPLETED, FAILED or CANCELLED), it beat since ``first`` (same
    fence, a later ``heartbeat_ms``), or a newer attempt started (another fence, RUNNING). A
    holder that did none of these since ``first`` — a dead worker whose lease has not expired
    yet, or a job a sweeper took over (LOST) — is waited for. So a duplicate delivery of a live
    job never runs its body, also when the live run ends while the duplicate waits (the old
    rule, "wait for any holder", then took the lease and ran the whole job again).
    """
    if now.state in _ENDED_BY_HOLDER or first.state in _ENDED_BY_HOLDER:
        return True
    if now.state is not JobState.RUNNING and now.state is not JobState.STALE:
        return False  # LOST (claimed by a sweeper) or no snapshot: nobody live holds it
    if now.fence != first.fence:
        return now.state is JobState.RUNNING
    return now.heartbeat_ms != first.heartbeat_ms


#: What a duplicate attempt reads of the holder (the verdict fields come with any read).
_HOLDER_FIELDS = ("fence", "heartbeat_ms")


@contextlib.asynccontextmanager
async def keep_claim(
    refresh: Callable[[], Awaitable[object]],
    period: float,
    *,
    job_id: str,
    holds: Callable[[], bool] = lambda: True,
) -> AsyncIterator[None]:
    """Call ``refresh()`` at once and every ``period`` seconds while the block runs.

    The refresh loop is a task owned by this block: at exit it is told to stop, cancelled and
    awaited, whatever the block raised. Each refresh is bounded by ``period``; an error is logged
    and the next refresh tried on schedule. ``holds()`` is asked before each refresh
    (:class:`ClaimHold`): once it said False the loop ends, so a body that outlives its lease
    (a thread) never keeps the queue's claim.
    """
    stop = asyncio.Event()
    loop = _refresh_loop(refresh, period, job_id, stop, holds)
    task = asyncio.get_running_loop().create_task(loop)
    try:
        yield
    finally:
        stop.set()
        task.cancel()
        await asyncio.wait({task})


async def _refresh_loop(
    refresh: Callable[[], Awaitable[object]],
    period: float,
    job_id: str,
    stop: asyncio.Event,
    holds: Callable[[], bool],
) -> None:
    # `stop` as well as the cancel: a refresh that swallows its CancelledError (a client library
    # may) must not keep this loop alive. A first version without `stop` hung, now and then, at
    # the exit of a job whose body returned during the first refresh (arq worker, redis-py 8).
    warn = RateLimitedLog(log, time.monotonic)
    hold = ClaimHold()
    for delay in refresh_delays(period):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        if stop.is_set() or not hold.ask(holds()):
            return
        try:
            async with asyncio.timeout(period):
                await refresh()
        except Exception as exc:  # a fault here must never stop the task: the lease decides
            warn.warning("job %s: could not refresh the queue's claim: %r", job_id, exc)


@contextlib.asynccontextmanager
async def pulse(
    options: PulseOptions,
    redis: Any,
    queue_job_id: str | bytes,
    task_name: str,
    refresh: Callable[[], Awaitable[object]] | None,
    *,
    sidecar: bool = False,
    claim: HelperClaim | None = None,
) -> AsyncIterator[AsyncPulse]:
    """Run the block under ``heartbeat()`` for a queue's job, keeping the queue's claim fresh.

    Args:
        options: the integration's options.
        redis: the client jobpulse writes to (``options.redis`` wins when set).
        queue_job_id: the queue's job id, mapped by :func:`job_id_for`.
        task_name: the task's name, the job's ``kind`` (mapped by :func:`kind_for`).
        refresh: the queue's claim refresh, called every ``options.interval`` seconds while the
            heartbeat holds its lease; None: the integration keeps the claim itself (taskiq's
            worker-wide keeper).
        sidecar: beat from jobpulse's helper process (``heartbeat(..., sidecar=True)``): for a
            task the queue runs in a thread, whose GIL hold would starve this loop's beats.
        claim: with ``sidecar``, the queue's claim refresh for the helper to run beside the
            beats (then ``refresh`` runs in this loop only until the heartbeat is entered:
            :func:`plan_claim`, as :func:`pulse_sync`); None: ``refresh`` runs in this loop.

    A lease held by another attempt (JobBusy) is waited for, up to ``claim_ttl``, only while
    that holder is not alive (:func:`holder_alive`): a queue may hand a dead worker's job on a
    moment before that worker's lease has expired; a live holder means a duplicate delivery,
    which raises ``JobBusy`` before the body runs.
    """
    job_id = job_id_for(queue_job_id)
    client = options.redis if options.redis is not None else redis
    plan = plan_claim(refresh, claim, sidecar=sidecar)
    entering: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
    if plan.entering is not None:
        entering = keep_claim(plan.entering, options.interval, job_id=job_id)
    async with entering:
        hb = await _enter(options, client, job_id, task_name, sidecar, plan.keeper)

    def holds() -> bool:
        return hb.lease_held

    try:
        if plan.running is None:
            yield hb
        else:
            async with keep_claim(plan.running, options.interval, job_id=job_id, holds=holds):
                yield hb
    except BaseException as exc:
        await hb.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    else:
        await hb.__aexit__(None, None, None)


async def _enter(
    options: PulseOptions,
    client: Any,
    job_id: str,
    task_name: str,
    sidecar: bool,
    keeper: HelperClaim | None,
) -> AsyncPulse:
    """Enter the job's heartbeat for :func:`pulse`: a ``JobBusy`` of a holder that is not (or
    no longer) alive is waited out, up to the claim's TTL."""
    deadline = time.monotonic() + options.claim_ttl
    first: HolderView | None = None
    reader: StatusReader | None = None
    while True:
        hb = heartbeat(
            client,
            job_id,
            interval=options.interval,
            ttl=options.ttl,
            namespace=options.namespace,
            kind=kind_for(task_name),
            sidecar=sidecar,
        )
        if keeper is not None and isinstance(hb, AsyncSidecarHeartbeat):
            hb.keep(keeper)
        try:
            await hb.__aenter__()
        except JobBusy:
            if reader is None:
                reader = StatusReader(client, namespace=options.namespace, cache_ttl=0)
            view = await _holder(reader.get(job_id, _HOLDER_FIELDS))
            first = first or view
            if time.monotonic() >= deadline or (view and first and holder_alive(first, view)):
                raise
            await asyncio.sleep(retry_after(options.interval))
            continue
        return hb


async def _holder(read: Awaitable[JobStatus]) -> HolderView | None:
    """The holder's view, or None when Redis could not be read (then the wait goes on, up to
    its deadline: the next refusal reads again)."""
    try:
        return HolderView.of(await read)
    except Exception as exc:
        if not is_redis_fault(exc):
            raise
        return None


async def run_in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run a plain ``def`` task in the loop's default executor, as the queues run them, with
    this context (so ``jobpulse.current()`` works in the thread).

    A thread cannot be cancelled: when the awaiting task is cancelled, the job's
    ``progress.cancelled`` is set (so ``jobpulse.current().progress.check()`` raises in the
    thread) and this waits for the function to return before the cancellation goes on, so two
    runs of a job never overlap. Every further cancel while it waits (SAQ cancels again at its
    ``cancellation_hard_deadline_s``; an anyio scope cancels at every ``await``) is held back
    the same way: the heartbeat, and with it the lease, lives until the thread has returned.
    """
    context = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(context.run, fn, *args, **kwargs)
    )
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        hb = current()
        if hb is not None:  # cancelled from outside (a queue's timeout): check() raises now
            hb.progress._cancel()
        await hold_back(future)
        raise


async def hold_back(waited: asyncio.Future[Any]) -> None:
    """Wait for ``waited`` to end, holding back every cancel of the caller meanwhile (a queue may
    cancel again and again: SAQ's hard deadline, an anyio scope); the caller re-raises."""
    while not waited.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({waited})


_SYNC_CLASSES: dict[str, type[Any]] = {
    "tcp": redis_sync.Connection,
    "ssl": redis_sync.SSLConnection,
    "unix": redis_sync.UnixDomainSocketConnection,
}
_HELPER_CLIENTS: dict[bytes, redis_sync.Redis] = {}  # (in the helper) one client per broker


@dataclass(frozen=True, slots=True, kw_only=True)
class HelperClaim:
    """A queue's claim refresh run by the sidecar helper process, beside the job's beats.

    Sent to the helper with the job (it is pickled: ``refresh`` must be a module-level function
    or a ``functools.partial`` of one). There ``refresh(client)`` is called with a blocking
    ``redis.Redis`` built from ``broker`` (the queue's connection settings), in a thread of the
    helper, at once and every ``period`` seconds while the job's lease is held (the schedule
    and rules of :func:`keep_claim`). The helper ends at its owner's death, and the refresh
    with it: a dead worker's claim expires as before; a worker whose body holds the GIL keeps
    its claim.

    Attributes:
        broker: how to rebuild the queue's client in the helper.
        refresh: the queue's "I still hold this job" write, given that client.
        period: seconds between refreshes.
        job_id: the jobpulse job id (for the warning of a failing refresh).
    """

    broker: RedisFactory
    refresh: Callable[[redis_sync.Redis], object]
    period: float
    job_id: str

    @classmethod
    def of(
        cls, broker: Any, refresh: Callable[[redis_sync.Redis], object], period: float, job_id: str
    ) -> HelperClaim | None:
        """The claim for ``broker`` (a plain ``redis.Redis``), or None when jobpulse cannot
        rebuild that client in the helper (Sentinel, Cluster, a credential provider): the
        claim is then refreshed from the worker's own process."""
        try:
            factory = factory_of(broker)
        except TypeError:
            return None
        return cls(broker=factory, refresh=refresh, period=period, job_id=job_id)

    def client(self) -> redis_sync.Redis:
        """The helper's client for this broker (one per broker, shared by its jobs)."""
        key = pickle.dumps(self.broker)
        client = _HELPER_CLIENTS.get(key)
        if client is None:
            pool = redis_sync.ConnectionPool(
                connection_class=_SYNC_CLASSES[self.broker.kind], **self.broker.settings
            )
            client = _HELPER_CLIENTS[key] = redis_sync.Redis.from_pool(pool)
        return client

    def keep(self, holds: Callable[[], bool]) -> contextlib.AbstractAsyncContextManager[None]:
        """(In the helper) the refresh loop around the job's body."""
        client = self.client()

        async def refresh() -> None:
            await asyncio.to_thread(self.refresh, client)

        return keep_claim(refresh, self.period, job_id=self.job_id, holds=holds)


@contextlib.contextmanager
def keep_claim_sync(
    refresh: Callable[[], object] | None,
    period: float,
    *,
    job_id: str,
    holds: Callable[[], bool] = lambda: True,
    watch: Callable[[], object] | None = None,
) -> Iterator[None]:
    """Call ``refresh()`` at once and every ``period`` seconds, from a thread, while the block runs.

    The sync twin of :func:`keep_claim` (same schedule, same rate-limited warning): the thread
    is told to stop and joined at exit. ``holds()`` is asked before each refresh; once it says
    False (the heartbeat's lease is lost) the thread stops refreshing for good, so an orphaned
    body never keeps the queue's claim of a job another attempt owns. ``watch()``, when given,
    is called on the same schedule whether or not the lease is held (RQ: a work horse whose
    main process died ends itself).
    """
    stop = threading.Event()

    def loop() -> None:
        warn = RateLimitedLog(log, time.monotonic)
        hold = ClaimHold(refresh is not None)
        for delay in refresh_delays(period):
            if stop.wait(delay):
                return
            holding = hold.ask(holds())
            if not holding and watch is None:
                return
            try:
                if watch is not None:
                    watch()
                if holding and refresh is not None:
                    refresh()
            except Exception as exc:  # a fault here must never stop the task: the lease decides
                warn.warning("job %s: could not refresh the queue's claim: %r", job_id, exc)

    thread = threading.Thread(target=loop, name=f"jobpulse-claim:{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def pulse_sync(
    options: PulseOptions,
    redis: Any,
    queue_job_id: str | bytes,
    task_name: str,
    refresh: Callable[[], object] | None,
    *,
    watch: Callable[[], object] | None = None,
    claim: HelperClaim | None = None,
) -> Iterator[SyncHeartbeat | SidecarHeartbeat]:
    """Run the block under ``jobpulse.sync.heartbeat()`` for a queue's job, keeping the queue's
    claim fresh: the sync twin of :func:`pulse`, with the same arguments (``redis`` is a blocking
    ``redis.Redis``; ``refresh`` None: the queue has no claim to keep). The claim is refreshed
    only while the heartbeat holds its lease: an orphaned body never keeps it. ``watch`` is
    passed to :func:`keep_claim_sync`.

    With ``options.sidecar`` the job's beats go out from the sidecar helper process, and so
    does the claim's refresh when ``claim`` is given (else ``refresh`` runs here, in a thread).
    Until the heartbeat is entered (the helper started, the lease acquired, the helper's
    refresh begun) ``refresh`` runs here: the claim is never left without a refresh between
    the queue's hand-over and the helper's first one.
    """
    job_id = job_id_for(queue_job_id)
    client = options.redis if options.redis is not None else redis
    plan = plan_claim(refresh, claim, sidecar=options.sidecar)
    entering: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if plan.entering is not None:
        entering = keep_claim_sync(plan.entering, options.interval, job_id=job_id)
    with entering:
        hb = _enter_sync(options, client, job_id, task_name, plan.keeper)

    def holds() -> bool:  # the lease is neither lost nor past its deadline
        return hb.lease_held

    try:
        if plan.running is None and watch is None:
            yield hb
        else:
            with keep_claim_sync(
                plan.running, options.interval, job_id=job_id, holds=holds, watch=watch
            ):
                yield hb
    except BaseException as exc:
        hb.__exit__(type(exc), exc, exc.__traceback__)
        raise
    else:
        hb.__exit__(None, None, None)


def _enter_sync(
    options: PulseOptions, client: Any, job_id: str, task_name: str, keeper: HelperClaim | None
) -> SyncHeartbeat | SidecarHeartbeat:
    """Enter the job's heartbeat for :func:`pulse_sync`: a ``JobBusy`` of a holder that is not
    (or no longer) alive is waited out, up to the claim's TTL."""
    deadline = time.monotonic() + options.claim_ttl
    first: HolderView | None = None
    reader: SyncStatusReader | None = None
    while True:
        hb = sync_heartbeat(
            client,
            job_id,
            interval=options.interval,
            ttl=options.ttl,
            namespace=options.namespace,
            kind=kind_for(task_name),
            sidecar=options.sidecar,
        )
        if keeper is not None and isinstance(hb, SidecarHeartbeat):
            hb.keep(keeper)
        try:
            hb.__enter__()
        except JobBusy:
            if reader is None:
                reader = SyncStatusReader(client, namespace=options.namespace, cache_ttl=0)
            view = _holder_sync(reader, job_id)
            first = first or view
            if time.monotonic() >= deadline or (view and first and holder_alive(first, view)):
                raise
            time.sleep(retry_after(options.interval))
            continue
        return hb


def leave_recorded(stack: contextlib.ExitStack, exc: BaseException | None, job_id: str) -> None:
    """Leave a task's heartbeat (entered on ``stack``, or nothing) as its body ended (``exc``),
    once the queue has recorded the task: the sync queues' final write comes last.

    What the heartbeat raises now changes nothing in the queue's record, so it is logged, not
    raised into the queue's machinery: ``JobCancelled`` (a body that returned after a cancel
    request, recorded CANCELLED) at INFO, anything else (``LeaseLost``, ``StateNotWritten``) at
    WARNING. The body's own exception, which the heartbeat does not suppress, is the queue's.
    """
    try:
        if exc is None:
            stack.__exit__(None, None, None)
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)
    except Exception as raised:
        if raised is exc:
            return
        level = logging.INFO if isinstance(raised, JobCancelled) else logging.WARNING
        log.log(
            level, "job %s: %r (jobpulse recorded it; the queue's record stands)", job_id, raised
        )


def _holder_sync(reader: SyncStatusReader, job_id: str) -> HolderView | None:
    """:func:`_holder` for the sync shell."""
    try:
        return HolderView.of(reader.get(job_id, _HOLDER_FIELDS))
    except Exception as exc:
        if not is_redis_fault(exc):
            raise
        return None
