"""The owner's side of a sidecar job: a thin proxy with the public members of a heartbeat.

:class:`SidecarJob` is the one core: it checks the options (a :class:`BeatMachine` is built for
that, before any Redis write), holds the job's :class:`~jobpulse.ProgressCell`, and turns each
call into a request to the helper that returns a ``concurrent.futures.Future``. The two faces
only wait differently: :class:`SidecarHeartbeat` (``with``) blocks on the future,
:class:`AsyncSidecarHeartbeat` (``async with``) awaits it (``asyncio.wrap_future``), and also
cancels its body task on an interrupt, as the in-loop asyncio heartbeat does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from contextvars import Token
from types import TracebackType
from typing import Any, Protocol

from ..._protocol.rebuild import ClientFactory, checked_factory
from ...errors import JobCancelled, LeaseLost, LeaseLostCause, StateNotWritten
from ..current import enter_current, leave_current
from ..machine import BeatMachine
from ..options import HeartbeatSpec
from ..progress import ProgressCell
from ..shell import HeartbeatStatistics
from ..stats import WORKER_STATS, notify
from .channel import Channel, HelperDied, channel

__all__ = ["AsyncSidecarHeartbeat", "Keeper", "SidecarHeartbeat", "SidecarJob"]

_HELPER_SLACK = 10.0
"""Seconds an owner waits for its helper beyond the helper's own bound (start-up, a loaded
machine) before it gives up on an answer: a hung helper never hangs the owner for ever."""


class Keeper(Protocol):
    """Work the helper does beside a job's beats (a queue integration's claim refresh).

    A picklable object (its class importable by module path): the helper calls
    ``keep(holds)`` and runs the job's body inside the async context manager it returns, in the
    helper's loop; ``holds()`` is True while the job's lease is held. It stops with the job, and
    with the helper, which ends at its owner's death: a GIL hold or a blocked loop in the owner
    never delays it.
    """

    def keep(self, holds: Callable[[], bool]) -> AbstractAsyncContextManager[object]: ...


class SidecarJob:
    """The blocking core shared by both faces (see the module docstring).

    Attributes:
        job_id: the job.
        kind: the job's kind (``""`` for none).
        progress: the job's :class:`~jobpulse.ProgressCell`, read by the helper.
    """

    _face = "SidecarJob"

    def __init__(
        self,
        redis: Any,
        job_id: str,
        spec: HeartbeatSpec,
        *,
        client_factory: ClientFactory | None = None,
    ) -> None:
        if spec.clock is not time.monotonic:
            raise ValueError("sidecar=True: a custom clock is not supported (pass sidecar=False)")
        if spec.worker is None:  # the owner's name, not the helper's
            spec = dataclasses.replace(spec, worker=f"{socket.gethostname()}:{os.getpid()}")
        self._m: BeatMachine[None] = BeatMachine(job_id, spec)  # checks every option
        options = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        del options["clock"]  # the helper's is its own monotonic clock
        self._factory = checked_factory(client_factory, redis)
        self._redis = redis
        self._options = options
        self._keeper: Keeper | None = None
        self.job_id = self._m.job_id
        self.kind = self._m.kind
        self.progress: ProgressCell
        self._channel: Channel | None = None
        self._key = 0
        self._fence = 0
        self._attempt = 0
        self._resume_from: Any = None
        self._stats = HeartbeatStatistics.of(self._m)
        self._entered = False
        self._in_body = False
        self._lost: LeaseLostCause | None = None
        self._current: Token[Any] | None = None

    # -- public API (both faces) ---------------------------------------------------------------

    @property
    def fence(self) -> int:
        """The fencing number of this attempt."""
        return self._fence

    @property
    def attempt(self) -> int:
        """1 for a first run, n + 1 for a run that took over a STALE or LOST job."""
        return self._attempt

    @property
    def resume_from(self) -> Any:
        """The last checkpoint details of the previous attempt (STALE or LOST), else None."""
        return self._resume_from

    @property
    def stage(self) -> str:
        return self._m.stage

    @property
    def cancelled(self) -> bool:
        """True once the job must stop (a cancel request, a lost lease, a dead helper, the end)."""
        return self.progress.cancelled

    @property
    def lease_held(self) -> bool:
        """True while the helper holds the job's lease (entered, not lost, helper alive)."""
        return self._in_body and self._lost is None and not self.progress.cancelled

    @property
    def helper_pid(self) -> int | None:
        """The pid of the helper process beating this job (None before enter)."""
        return None if self._channel is None else self._channel.pid

    def keep(self, keeper: Keeper) -> None:
        """Before enter: have the helper run ``keeper`` beside this job's beats (see
        :class:`Keeper`; the queue integrations' claim refresh)."""
        if self._entered:
            raise RuntimeError("keep() must be called before the heartbeat is entered")
        self._keeper = keeper

    def check(self) -> None:
        """Raise :class:`~jobpulse.JobCancelled` once the job must stop."""
        if self.cancelled:
            raise JobCancelled(f"job {self.job_id!r} must stop")

    def set_stage(self, name: str) -> None:
        """Name the current stage; the next beat records it (a ``stage`` stream entry).

        Raises:
            ValueError: ``name`` is empty, longer than 200 characters, or not printable.
        """
        if self._m.set_stage(name):
            notify("stage", self.job_id, self.kind, {"stage": name})
            if self._channel is not None and self._in_body:
                with contextlib.suppress(HelperDied):  # the job stops: its exit raises LeaseLost
                    self._channel.send(("stage", self._key, name))

    def statistics(self) -> HeartbeatStatistics:
        """This heartbeat's counters (asked of the helper; the last known ones once it ended)."""
        if self._channel is not None and self._in_body:
            future = self._channel.request("stats", self._key)
            try:
                stats = future.result(self._m.cfg.ttl)
            except (HelperDied, TimeoutError):
                return self._stats
            if stats is not None:
                self._stats = stats
        return self._stats

    def __repr__(self) -> str:
        lease = "lost" if self._lost is not None else ("held" if self._in_body else "not held")
        return (
            f"<{self._face} job={self.job_id} fence={self._fence} attempt={self._attempt} "
            f"stage={self.stage!r} lease={lease} helper={self.helper_pid}>"
        )

    # -- the core: requests to the helper ----------------------------------------------------------

    def _begin(self) -> concurrent.futures.Future[Any]:
        if self._entered:
            raise RuntimeError(f"a {self._face} can be entered only once")
        self._entered = True
        self.progress = ProgressCell(self._m.total)
        try:
            self._channel = ch = channel()
            cid = ch.client_id(self._redis, self._factory)
            self._key = ch.new_key()
            ch.jobs[self._key] = self
            return ch.request(
                "start", self._key, cid, self.job_id, self._options, self.progress, self._keeper
            )
        except BaseException:
            self._forget()
            raise

    def _started(self, reply: Any) -> None:
        self._fence, self._attempt, self._resume_from, self._stats = reply
        self._in_body = True
        self._current = enter_current(self)  # type: ignore[arg-type]

    def _start_failed(self, exc: BaseException) -> BaseException:
        self._forget()
        if isinstance(exc, HelperDied):
            # as for a death mid-job: the helper may have taken the lease before it died (STALE
            # within ttl, a sweeper records LOST); the process's next job starts a new helper
            self._lost = LeaseLostCause.SIDECAR_DIED
            return LeaseLost(self.job_id, LeaseLostCause.SIDECAR_DIED)
        return exc

    def _checkpoint(self, details: dict[str, Any]) -> concurrent.futures.Future[Any]:
        self._m.checkpoint_text(details)  # TypeError / ValueError here, before anything is sent
        self._raise_if_lost()
        if not self._in_body:
            raise RuntimeError("checkpoint() is only allowed inside the heartbeat's block")
        notify("checkpoint", self.job_id, self.kind, details)
        assert self._channel is not None
        return self._channel.request("checkpoint", self._key, details)

    def _checkpoint_failed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, HelperDied):
            return LeaseLost(self.job_id, LeaseLostCause.SIDECAR_DIED)
        return exc

    def _end(self, outcome: tuple[Any, ...]) -> concurrent.futures.Future[Any]:
        self._in_body = False
        leave_current(self._current)
        self._current = None
        assert self._channel is not None
        return self._channel.request("end", self._key, outcome)

    def _exit_limit(self) -> float:
        cfg = self._m.cfg
        return cfg.final_timeout + 2 * cfg.ttl + _HELPER_SLACK

    def _start_limit(self) -> float:
        return self._m.cfg.ttl + _HELPER_SLACK

    def _finish(self, verdict: tuple[Any, ...] | BaseException, exc: BaseException | None) -> None:
        """Raise what the block must raise (else ``exc``, if any, propagates)."""
        self._forget()
        cause = exc if not isinstance(exc, asyncio.CancelledError | JobCancelled) else None
        if isinstance(verdict, BaseException):
            if isinstance(verdict, HelperDied | TimeoutError):
                self._lost = LeaseLostCause.SIDECAR_DIED
                raise LeaseLost(self.job_id, LeaseLostCause.SIDECAR_DIED) from (cause or verdict)
            raise verdict
        what = verdict[0]
        if what == "ok":
            return
        if what == "propagate":
            if exc is not None:
                for note in verdict[1]:
                    exc.add_note(note)
            return
        if what == "lease_lost":
            self._lost = LeaseLostCause[verdict[1]]
            raise LeaseLost(self.job_id, self._lost) from cause
        if what == "job_cancelled":
            raise JobCancelled(verdict[1])
        if what == "not_written":
            raise StateNotWritten(verdict[1])
        raise RuntimeError(f"jobpulse sidecar helper failed job {self.job_id!r}: {verdict[1]}")

    def _forget(self) -> None:
        self._in_body = False
        if self._channel is not None:
            self._channel.jobs.pop(self._key, None)
        cell = getattr(self, "progress", None)
        if cell is not None:
            cell._cancel()
            cell._unlink()

    def _raise_if_lost(self) -> None:
        if self._lost is not None:
            raise LeaseLost(self.job_id, self._lost)

    def _interrupted(self, cause: str | None) -> None:
        """From the channel's thread: the lease was lost (``cause``), a cancel was requested
        (None), or the helper died (``"SIDECAR_DIED"``). The cell reads cancelled from now."""
        if cause is not None and self._lost is None:
            self._lost = LeaseLostCause[cause]
            if self._lost is LeaseLostCause.SIDECAR_DIED:
                WORKER_STATS.lost("sidecar_died")
        self.progress._cancel()


async def _hold_back(waited: asyncio.Future[Any]) -> None:
    """Wait for ``waited`` to end, holding back every cancel meanwhile (an anyio scope cancels
    again at every ``await``); the caller re-raises."""
    while not waited.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({waited})


def body_outcome(exc: BaseException | None, *, external_cancel: bool) -> tuple[Any, ...]:
    """How the owner's body ended, as the helper replays it (pure)."""
    if exc is None:
        return ("ok",)
    if isinstance(exc, asyncio.CancelledError):
        return ("cancel",) if external_cancel else ("ok",)
    if isinstance(exc, JobCancelled):
        return ("job_cancelled", str(exc))
    return ("error", type(exc).__name__, str(exc))


class SidecarHeartbeat(SidecarJob):
    """A sync job whose beats a helper process sends: ``with jobpulse.sync.heartbeat(...)``.

    The same members as :class:`jobpulse.sync.SyncHeartbeat`. The body learns of a cancel
    request, a lost lease or a dead helper through :meth:`check` / :attr:`cancelled`.
    """

    _face = "SidecarHeartbeat"

    def __enter__(self) -> SidecarHeartbeat:
        future = self._begin()
        try:
            reply = future.result(self._start_limit())
        except BaseException as exc:
            raise self._start_failed(exc) from None
        self._started(reply)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        future = self._end(body_outcome(exc, external_cancel=False))
        verdict: tuple[Any, ...] | BaseException
        try:
            verdict = future.result(self._exit_limit())
        except BaseException as error:
            verdict = error
        self._finish(verdict, exc)

    def checkpoint(self, timeout: float | None = None, **details: Any) -> bool:
        """Send a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        Blocks until the beat is written, or ``timeout`` seconds passed (default: ``ttl``).

        Returns:
            True when written, False when the time ran out first.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost (or the helper died) before it was written.
        """
        future = self._checkpoint(details)
        try:
            future.result(self._m.cfg.ttl if timeout is None else timeout)
        except TimeoutError:
            return False
        except BaseException as exc:
            raise self._checkpoint_failed(exc) from None
        return True


class AsyncSidecarHeartbeat(SidecarJob):
    """An asyncio job whose beats a helper process sends: ``async with heartbeat(...,
    sidecar=True)``. The same members as :class:`~jobpulse.JobHeartbeat`; a cancel request, a
    lost lease or a dead helper cancels the body's task, as in-loop beats do."""

    _face = "AsyncSidecarHeartbeat"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._our_cancels = 0
        self._asking: concurrent.futures.Future[Any] | None = None

    def statistics(self) -> HeartbeatStatistics:
        """This heartbeat's counters, without waiting for the helper (the event loop never
        blocks on the pipe): those the helper sent last, and each call asks it for newer ones,
        which a later call returns (one request in flight at most); the last known ones once
        the job ended or the helper died."""
        if self._channel is not None and self._in_body and self._asking is None:
            self._asking = asking = self._channel.request("stats", self._key)
            asking.add_done_callback(self._answered)
        return self._stats

    def _answered(self, asking: concurrent.futures.Future[Any]) -> None:
        """(The channel's reader thread, or the caller's) the helper's answer to ``stats``."""
        self._asking = None
        if asking.exception() is None and asking.result() is not None:
            self._stats = asking.result()

    async def __aenter__(self) -> AsyncSidecarHeartbeat:
        self._host = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        future = self._begin()
        waiting = asyncio.ensure_future(
            asyncio.wait_for(asyncio.wrap_future(future), self._start_limit())
        )
        try:
            reply = await asyncio.shield(waiting)
        except asyncio.CancelledError:
            await self._abandon(waiting)
            raise
        except BaseException as exc:
            raise self._start_failed(exc) from None
        self._started(reply)
        return self

    async def _abandon(self, waiting: asyncio.Future[Any]) -> None:
        """The enter was cancelled while the helper takes the lease (a queue's timeout): the
        helper starts the job all the same, so wait for its answer and end the job CANCELLED
        (every further cancel held back meanwhile), never leaving it beaten RUNNING, its lease
        held, for as long as this process lives. The caller re-raises the cancellation."""
        await _hold_back(waiting)
        if waiting.cancelled() or waiting.exception() is not None:
            self._forget()  # not started (or the helper is gone): nothing to end
            return
        self._started(waiting.result())
        ending = asyncio.ensure_future(
            asyncio.wait_for(asyncio.wrap_future(self._end(("cancel",))), self._exit_limit())
        )
        await _hold_back(ending)
        if not ending.cancelled():
            ending.exception()  # retrieved: the cancellation is what the caller raises
        self._forget()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        host, ours = self._host, self._our_cancels
        self._our_cancels = 0
        if host is not None:
            for _ in range(ours):
                host.uncancel()
        external = isinstance(exc, asyncio.CancelledError) and (
            not ours or (host is not None and host.cancelling() > 0)
        )
        future = self._end(body_outcome(exc, external_cancel=external))
        waiting = asyncio.ensure_future(
            asyncio.wait_for(asyncio.wrap_future(future), self._exit_limit())
        )
        verdict: tuple[Any, ...] | BaseException
        try:
            verdict = await asyncio.shield(waiting)
        except asyncio.CancelledError:
            await asyncio.wait([waiting])  # the final write goes on: wait for it, then re-raise
            self._forget()
            raise
        except BaseException as error:
            verdict = error
        self._finish(verdict, exc)

    async def checkpoint(self, **details: Any) -> None:
        """Force a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost (or the helper died) before it was written.
        """
        future = self._checkpoint(details)
        try:
            await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise self._checkpoint_failed(exc) from None

    def _interrupted(self, cause: str | None) -> None:
        super()._interrupted(cause)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to cancel
                self._loop.call_soon_threadsafe(self._interrupt)

    def _interrupt(self) -> None:
        if self._in_body and self._host is not None and not self._host.done():
            self._host.cancel()
            self._our_cancels += 1
