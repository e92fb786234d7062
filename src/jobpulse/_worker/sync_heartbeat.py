"""``jobpulse.sync.heartbeat()`` and ``SyncHeartbeat``: the thread shell of a job's heartbeat.

The same :class:`~jobpulse._worker.machine.BeatMachine` as the asyncio shell decides everything,
and the same step sequences of :mod:`~jobpulse._worker.life` enter and end the job; this shell
drives them with blocking I/O in the body's thread (``_drive``) and leaves the beats and
the lease deadline to the client's one :class:`~jobpulse._worker.thread_ticker.ThreadTicker`
thread. A sync body cannot be interrupted: it learns of a cancel request or a lost lease through
:meth:`SyncHeartbeat.check` or :attr:`SyncHeartbeat.cancelled` (and ``progress.check()``).

Every access to the machine holds the ticker's lock (the body's thread and the beat thread both
touch it); the body's side is a few assignments, never I/O under the lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack, overload

from .._protocol import calls
from .._protocol.clients import SyncClient
from .._protocol.rebuild import ClientFactory
from .current import enter_current, leave_current
from .life import Command, Send, Sleep, Stepper, Steps, acquire_steps, final_steps
from .options import HeartbeatOptions, HeartbeatSpec
from .progress import ProgressCell
from .shell import Shell
from .thread_ticker import ThreadTicker

if TYPE_CHECKING:
    from .sidecar.job import SidecarHeartbeat

__all__ = ["SyncHeartbeat", "heartbeat"]

log = logging.getLogger("jobpulse")
R = TypeVar("R")

_Handle = concurrent.futures.Future[None]


class SyncHeartbeat(Shell["_Handle"]):
    """The running job, as seen by a sync worker. Create it with :func:`jobpulse.sync.heartbeat`.

    Attributes:
        job_id: the job.
        progress: the job's :class:`~jobpulse.ProgressCell` (pass it to pool functions).
        kind: the job's kind (``""`` for none).
    """

    def __init__(self, redis: SyncClient, job_id: str, spec: HeartbeatSpec) -> None:
        """Private: use :func:`heartbeat`, which prepares ``spec`` from its keyword options."""
        super().__init__(redis, job_id, spec)
        self._ticker: ThreadTicker | None = None
        self._entered = False

    # -- public API --------------------------------------------------------------------------

    def checkpoint(self, timeout: float | None = None, **details: Any) -> bool:
        """Send a beat now that records ``details`` (JSON) as a ``checkpoint`` stream entry.

        Blocks until the beat is written, or ``timeout`` seconds passed (default: ``ttl``);
        the checkpoint then stays queued and goes out with a later beat.

        Returns:
            True when written, False when the time ran out first.

        Raises:
            TypeError: the details are not JSON-serialisable.
            ValueError: the details are larger than ``max_details_bytes``.
            LeaseLost: the lease was lost before the checkpoint was written.
        """
        text = self._checkpoint_text(details)
        handle: _Handle = concurrent.futures.Future()
        with self._lock():
            self._m.add_checkpoint(text, handle, self._clock())
            self._plan()
        try:
            handle.result(self._m.cfg.ttl if timeout is None else timeout)
        except TimeoutError:
            return False
        return True

    # -- enter and exit ------------------------------------------------------------------------

    def __enter__(self) -> SyncHeartbeat:
        if self._entered:
            raise RuntimeError("a SyncHeartbeat can be entered only once")
        self._entered = True
        self._ticker = ThreadTicker.for_client(self._redis, self._clock)
        self.progress = ProgressCell(self._m.total)
        try:
            self._drive(acquire_steps(self._m, self._clock, self._warn.warning))
        except BaseException:
            self.progress._unlink()
            raise
        self._in_body = True
        self._ticker.add(self)
        self._current = enter_current(self)
        return self

    def _drive(self, steps: Steps[R]) -> R:
        """Run a sequence of :mod:`~jobpulse._worker.life` on this shell's client: the blocking
        driver (a call is bounded by the client's ``socket_timeout``, see ``docs/sync.md``)."""
        run = Stepper(steps)
        while (step := run.next()) is not None:
            try:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                elif isinstance(step, Send):
                    run.reply(calls.run_sync(self._redis, step.call))
                elif isinstance(step, Command):
                    run.reply(self._redis.execute_command(*step.args))
                else:
                    pipe = self._redis.pipeline(transaction=False)
                    for command in step.commands:
                        pipe.execute_command(*command)
                    run.reply(pipe.execute(raise_on_error=False))
            except Exception as exc:
                run.fail(exc)
        return run.result

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock():
            self._in_body = False
            self._ended = True
            # a deadline that passed while the beat thread was blocked counts now
            cause = self._m.check_expiry(self._clock()).cause
            if cause is not None:
                self.lease_expired(cause)
        leave_current(self._current)
        self._current = None
        if self._ticker is not None:
            self._ticker.remove(self)
        try:
            self._finish(exc)
        finally:
            self.progress._cancel()
            self.progress._unlink()

    def _finish(self, exc: BaseException | None) -> None:
        """Write the final state; raise what the ``with`` must raise (else the body's own
        exception, if any, propagates unchanged). A sync body is never interrupted by us."""
        with self._lock():
            end = self._m.ending(
                crash=self._crash, exc=exc, interrupted=False, external_cancel=False
            )
        written: bool | None = None
        if end.plan.write:
            steps = final_steps(self._m, end.plan, self._clock, self._warn.warning, self._reading)
            written = self._drive(steps)
        end.leave(written)

    # -- what this shell adds to the shared one (called under the ticker's lock) ---------------

    def _lock(self) -> Any:
        assert self._ticker is not None
        return self._ticker.lock

    def _interrupt(self) -> None:
        self.progress._cancel()  # a sync body cannot be interrupted: it asks check()


@overload
def heartbeat(
    redis: SyncClient,
    job_id: str,
    *,
    sidecar: Literal[True] = True,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> SidecarHeartbeat: ...


@overload
def heartbeat(
    redis: SyncClient,
    job_id: str,
    *,
    sidecar: Literal[False],
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> SyncHeartbeat: ...


@overload
def heartbeat(
    redis: SyncClient,
    job_id: str,
    *,
    sidecar: bool,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> SyncHeartbeat | SidecarHeartbeat: ...


def heartbeat(
    redis: SyncClient,
    job_id: str,
    *,
    sidecar: bool = True,
    client_factory: ClientFactory | None = None,
    **options: Unpack[HeartbeatOptions],
) -> SyncHeartbeat | SidecarHeartbeat:
    """Run a job under a heartbeat from sync code: ``with heartbeat(client, job_id) as hb: ...``.

    The same protocol and exit rules as :func:`jobpulse.heartbeat`: entering takes the lease and
    writes the first snapshot; exiting writes COMPLETED, FAILED (an exception), CANCELLED
    (``JobCancelled`` from :meth:`SyncHeartbeat.check` after a cancel request) or LOST. The
    job's beats come from jobpulse's helper process (the sidecar, one per process), so a body
    holding the GIL cannot delay them; with ``sidecar=False`` every job on ``redis`` is beaten
    by one background thread of this process, which also keeps the lease deadlines. The body is
    never interrupted: it learns of a cancel or a lost lease through ``check()`` /
    ``cancelled``.

    Args:
        redis: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (give it a ``socket_timeout``
            below ``ttl``: a blocking pipeline is bounded by it).
        job_id: 1 to 200 characters of ``A-Z a-z 0-9 . _ - : /``.
        sidecar: beats from the helper process (default True) or, with False, from a thread of
            this process (docs/sync.md).
        client_factory: how the helper builds its client (see :func:`jobpulse.heartbeat`);
            needed for a ``RedisCluster`` or a Sentinel client.
        **options: the options of :func:`jobpulse.heartbeat` (the same names, types and
            defaults: ``HeartbeatOptions``; ``clock`` only with ``sidecar=False``).

    Raises:
        InvalidJobId: the job id or namespace is invalid (before any Redis command).
        ValueError, TypeError: an option is out of range (before any Redis command).
        JobBusy: another live worker holds the job.
        LeaseLost: (on exit) the lease was lost. With ``sidecar=True`` also on enter, cause
            ``SIDECAR_DIED``: the helper process died while the job started (a job it did
            start goes stale and a sweeper marks it LOST).
        JobCancelled: (on exit) the job was cancelled on request and the body ended normally.
    """
    spec = HeartbeatSpec(**options)
    if sidecar:
        from .sidecar.job import SidecarHeartbeat

        return SidecarHeartbeat(redis, job_id, spec, client_factory=client_factory)
    return SyncHeartbeat(redis, job_id, spec)
