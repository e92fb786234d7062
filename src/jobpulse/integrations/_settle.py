"""The order of the final writes: the queue stores its outcome first, jobpulse writes its end after.

A queue stores a task's outcome (result, status, retry) after the task function returned or
raised, so a heartbeat that ends inside the function writes COMPLETED before the queue's own
record exists: a reader that sees jobpulse's end and then reads the queue finds the task still
running there. :class:`SettledRun` runs the body under :func:`~._common.pulse` in a task of its
own (the host) and hands the body's outcome to the queue at once; the heartbeat keeps beating
until the queue says it stored its outcome (:meth:`SettledRun.queue_stored`, called from the
queue's after-hook: SAQ's ``after_process``, arq's ``after_job_end``, taskiq's ``post_save``)
or ``wait`` seconds passed, and only then writes its end.

Invariants:
  * only an outcome whose end is already decided is handed on before the end is written: the
    body returned, or raised an ordinary exception, while the lease is held and no cancel was
    requested. A cancel (``JobCancelled``, the queue's own cancel) or a lost lease changes what
    the queue must record, so those end first and hand on what the heartbeat raised (as
    before);
  * the host is never left behind: the queue's hook awaits it (:meth:`SettledRun.finished`),
    and without the hook it ends by itself after ``wait`` seconds;
  * what the heartbeat raises at a deferred end (``LeaseLost``, ``StateNotWritten``) is logged:
    the queue has recorded its outcome by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import JobCancelled
from ._common import AsyncPulse, HelperClaim, PulseOptions, hold_back, pulse

__all__ = ["SettledRun"]

log = logging.getLogger("jobpulse.integrations")


class SettledRun:
    """One task body under a heartbeat whose end is written after the queue's own outcome.

    Args:
        options: the integration's options.
        redis: the client jobpulse writes to (``options.redis`` wins when set).
        queue_job_id: the queue's job id.
        task_name: the task's name (the job's ``kind``).
        refresh: the queue's claim refresh (see :func:`~._common.pulse`), or None.
        body: the task body, given the heartbeat.
        settle: True when the queue's after-hook will call :meth:`queue_stored`; False ends
            the heartbeat as the body ends (the hook is not installed).
        wait: the longest the end waits for the hook (seconds).
        sidecar, claim: passed to :func:`~._common.pulse` (a task run in a thread: beats, and
            the claim's refresh, from the sidecar helper).
    """

    def __init__(
        self,
        options: PulseOptions,
        redis: Any,
        queue_job_id: str | bytes,
        task_name: str,
        refresh: Callable[[], Awaitable[object]] | None,
        body: Callable[[AsyncPulse], Awaitable[Any]],
        *,
        settle: bool,
        wait: float,
        sidecar: bool = False,
        claim: HelperClaim | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._outcome: asyncio.Future[Any] = loop.create_future()
        self._stored = asyncio.Event()
        self._settle = settle
        self._wait = wait
        pulsed = functools.partial(
            pulse, options, redis, queue_job_id, task_name, refresh, sidecar=sidecar, claim=claim
        )
        run = self._host(pulsed, body)
        self.host: asyncio.Task[Any] = loop.create_task(run)
        # What the host raised reached the queue through the outcome, or is logged by
        # finished(): never "Task exception was never retrieved" when no hook comes.
        self.host.add_done_callback(_retrieved)

    async def result(self, hold: Callable[[asyncio.Task[Any]], Awaitable[None]] = hold_back) -> Any:
        """The body's outcome (its value, or what it or the heartbeat raised), as soon as it is
        decided. A cancellation of the caller cancels the body once and waits, with ``hold``,
        for the heartbeat to write the end before it goes on."""
        try:
            return await asyncio.shield(self._outcome)
        except asyncio.CancelledError:
            if self._outcome.done() and not self._outcome.cancelled():
                raise  # the caller was cancelled after the outcome was decided
            self.host.cancel()
            await hold(self.host)
            raise

    def queue_stored(self) -> None:
        """The queue has stored its outcome: the heartbeat may write its end now."""
        self._stored.set()

    async def finished(self) -> None:
        """Wait for the heartbeat's end to be written (from the queue's after-hook)."""
        self.queue_stored()
        await hold_back(self.host)
        if self.host.cancelled():
            return
        exc = self.host.exception()
        if exc is not None and not self._handed_on(exc):
            log.warning("job end after the queue's outcome: %r", exc)

    def _handed_on(self, exc: BaseException) -> bool:
        outcome = self._outcome
        return outcome.done() and not outcome.cancelled() and outcome.exception() is exc

    async def _host(
        self,
        pulsed: Callable[[], contextlib.AbstractAsyncContextManager[AsyncPulse]],
        body: Callable[[AsyncPulse], Awaitable[Any]],
    ) -> Any:
        try:
            async with pulsed() as hb:
                try:
                    value = await body(hb)
                except Exception as exc:
                    if self._decided(hb, exc):
                        self._outcome.set_exception(exc)
                        await self._until_stored()
                    raise
                if self._decided(hb, None):
                    self._outcome.set_result(value)
                    await self._until_stored()
        except asyncio.CancelledError:
            if not self._outcome.done():
                self._outcome.cancel()
            raise
        except BaseException as exc:
            if not self._outcome.done():
                self._outcome.set_exception(exc)
            raise
        if not self._outcome.done():
            self._outcome.set_result(value)
        return value

    def _decided(self, hb: AsyncPulse, exc: Exception | None) -> bool:
        """May the outcome go to the queue before the heartbeat's end is written? Only when the
        hook will come, the lease is held and no cancel is under way (a cancel or a lost lease
        changes what the heartbeat raises, so the queue must record that instead)."""
        if not (self._settle and hb.lease_held and not hb.cancelled):
            return False
        return not isinstance(exc, JobCancelled)

    async def _until_stored(self) -> None:
        """Wait (heartbeat beating) for the queue's hook, at most ``wait`` seconds. A cancel
        of the host meanwhile (the heartbeat stopping a body that has already ended: a cancel
        request, a lost lease) is held back: the end then follows the body's outcome."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        while not self._stored.is_set() and loop.time() < deadline:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(deadline - loop.time()):
                    await self._stored.wait()


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
