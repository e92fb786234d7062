"""The sidecar helper process: ``python -m jobpulse._worker.sidecar.helper FD TRACKER OWNER``.

It runs one asyncio loop, and each job of its owner is the ordinary asyncio heartbeat
(:class:`~jobpulse._worker.heartbeat.JobHeartbeat`) running there: the same pure core, the same
shared :class:`~jobpulse._worker.ticker.Ticker`, the same scripts. The job's body, here, waits
for the owner's ``end`` message and ends as the owner's body ended; progress is read from the
owner's :class:`~jobpulse.ProgressCell` (shared memory), stage and checkpoints come as
messages. Nothing of the owner's work runs here, so no GIL hold and no blocked event loop in
the owner delays a beat.

Owner death: the helper holds a ``pidfd`` of its owner on its loop and reads the owner's pipe
in a thread; whichever signals first (the owner's exit, or end of file) ends the helper at once
with ``os._exit``: no final write, no further beat, so the owner's running jobs go STALE within
``ttl`` and a sweeper claims them, exactly as if the owner had beaten them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import sys
import threading
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from typing import Any

from ...errors import JobCancelled, LeaseLost, StateNotWritten
from ..heartbeat import JobHeartbeat
from ..machine import error_text
from ..options import HeartbeatSpec
from ..progress import ProgressCell
from ..sampling import ProcessSampler
from ..ticker import Ticker

__all__ = ["main"]


class _Helper:
    def __init__(self, conn: Connection, owner: int) -> None:
        self.conn = conn
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.factories: dict[int, bytes] = {}
        self.clients: dict[int, Any] = {}
        self.jobs: dict[int, _Job] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._send_lock = threading.Lock()

    async def run(self) -> None:
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            with contextlib.suppress(OSError):
                self.loop.add_reader(opener(self.owner), _owner_gone)
        if os.getppid() != self.owner:  # the owner died before we could watch it
            _owner_gone()
        threading.Thread(target=self._read, name="jobpulse-sidecar-read", daemon=True).start()
        await asyncio.Event().wait()  # for ever: the helper ends with its owner

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                _owner_gone()
            except Exception as exc:  # an unloadable message: answer it, keep serving
                sys.stderr.write(f"jobpulse sidecar: unreadable message: {exc!r}\n")
                continue
            self.loop.call_soon_threadsafe(self.dispatch, message)

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError):
            _owner_gone()

    def reply(self, rid: int, value: Any, error: BaseException | None = None) -> None:
        self.send(("reply", rid, value, None if error is None else _portable(error)))

    def spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "hello":
            sys.path[:] = message[1]
        elif kind == "client":
            self.factories[message[1]] = message[2]
        elif kind == "start":
            _, rid, key, cid, job_id, options, cell, keeper = message
            self.spawn(self.start(rid, key, cid, job_id, options, cell, keeper))
        elif kind == "stage":
            job = self.jobs.get(message[1])
            if job is not None:
                with contextlib.suppress(ValueError):  # checked by the owner already
                    job.hb.set_stage(message[2])
        elif kind == "checkpoint":
            _, rid, key, details = message
            self.spawn(self.checkpoint(rid, key, details))
        elif kind == "end":
            _, rid, key, outcome = message
            job = self.jobs.get(key)
            if job is None:
                self.reply(rid, None, RuntimeError(f"sidecar: no running job {key}"))
            elif not job.ended.done():
                job.end_rid = rid
                job.ended.set_result(outcome)
        elif kind == "stats":
            _, rid, key = message
            job = self.jobs.get(key)
            self.reply(rid, None if job is None else job.hb.statistics())

    def client(self, cid: int) -> Any:
        client = self.clients.get(cid)
        if client is None:
            client = self.clients[cid] = pickle.loads(self.factories[cid])()
        return client

    async def start(
        self,
        rid: int,
        key: int,
        cid: int,
        job_id: str,
        options: dict[str, Any],
        cell: ProgressCell,
        keeper: Any,
    ) -> None:
        try:
            client = self.client(cid)
            ticker = Ticker.for_client(client, options.get("clock") or _monotonic())
            if ticker._sampler._pid != self.owner:
                # rss_bytes and cpu_s are the owner's (with its children: this helper too)
                ticker._sampler = ProcessSampler(ticker._clock, pid=self.owner)
            hb = JobHeartbeat(client, job_id, HeartbeatSpec(**options))
        except BaseException as exc:
            self.reply(rid, None, exc)
            return
        job = self.jobs[key] = _Job(hb, self.loop.create_future(), keeper)
        try:
            await job.run(self, rid, key, cell)
        finally:
            self.jobs.pop(key, None)

    async def checkpoint(self, rid: int, key: int, details: dict[str, Any]) -> None:
        job = self.jobs.get(key)
        try:
            if job is None:
                raise RuntimeError(f"sidecar: no running job {key}")
            await job.hb.checkpoint(**details)
        except BaseException as exc:
            self.reply(rid, None, exc)
        else:
            self.reply(rid, None)


class _Job:
    """One job of the owner, run by the asyncio heartbeat in this loop."""

    def __init__(
        self, hb: JobHeartbeat, ended: asyncio.Future[tuple[Any, ...]], keeper: Any = None
    ) -> None:
        self.hb = hb
        self.keeper = keeper  # a job.Keeper, or None
        self.ended = ended
        self.end_rid = 0
        self.raised: BaseException | None = None  # what our body raised for the owner

    async def run(self, helper: _Helper, rid: int, key: int, cell: ProgressCell) -> None:
        hb = self.hb
        started = False
        try:
            async with hb:
                # The job reads the owner's cell from here on (the one made at enter was only
                # read by the acquire, before the owner's body could count anything).
                own, hb.progress = hb.progress, cell
                own._unlink()
                started = True
                helper.reply(rid, (hb.fence, hb.attempt, hb.resume_from, hb.statistics()))
                if self.keeper is None:
                    await self.body(helper, key)
                else:
                    async with self.keeper.keep(self.holds):
                        await self.body(helper, key)
        except BaseException as exc:
            if not started:
                helper.reply(rid, None, exc)
                return
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task is not None:
                task.uncancel()  # our own, made to end the job as the owner's body ended
            helper.reply(self.end_rid, self.verdict(exc))
            return
        helper.reply(self.end_rid, ("ok",))

    def holds(self) -> bool:
        """True while the job's lease is held (what the keeper asks before each refresh)."""
        return self.hb.lease_held and not self.ended.done()

    async def body(self, helper: _Helper, key: int) -> None:
        """Wait for the owner's body to end, then end as it did."""
        while True:
            try:
                outcome = await asyncio.shield(self.ended)
                break
            except asyncio.CancelledError:
                # The heartbeat interrupted its body (a cancel request or a lost lease): the
                # owner's body learns it through the cell and the event; the job goes on until
                # the owner's body ends.
                lost = self.hb.machine.lease.lost
                helper.send(("event", key, "interrupt", None if lost is None else lost.name))
        if outcome[0] == "error":
            self.raised = type(outcome[1], (Exception,), {"__module__": "builtins"})(outcome[2])
            raise self.raised
        if outcome[0] == "job_cancelled":
            self.raised = JobCancelled(outcome[1])
            raise self.raised
        if outcome[0] == "cancel":  # an external cancel of the owner's asyncio body
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

    def verdict(self, exc: BaseException) -> tuple[Any, ...]:
        """What the owner must do with what left ``async with``."""
        if exc is self.raised or isinstance(exc, asyncio.CancelledError):
            return ("propagate", list(getattr(exc, "__notes__", ())))
        if isinstance(exc, LeaseLost):
            return ("lease_lost", exc.cause.name)
        if isinstance(exc, JobCancelled):
            return ("job_cancelled", str(exc))
        if isinstance(exc, StateNotWritten):
            return ("not_written", str(exc))
        return ("crash", error_text(exc))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (redis errors, TimeoutError, JobBusy...), else a
    RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"jobpulse sidecar helper: {error_text(exc)}")
    return exc


def _monotonic() -> Any:
    import time

    return time.monotonic


def _owner_gone() -> None:
    """The owner exited: stop at once, writing nothing more (its jobs go STALE within ttl)."""
    os._exit(0)


def main(argv: list[str]) -> None:
    fd, tracker, owner = (int(a) for a in argv[1:4])
    # The helper lives exactly as long as its owner: a Ctrl-C, SIGTERM or SIGHUP sent to the
    # whole process group is the owner's to handle (it may cancel its jobs and write CANCELLED,
    # which needs this helper); the owner's exit, whatever caused it, ends the helper.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if tracker >= 0:
        # share the owner's resource tracker, as a spawned multiprocessing child does
        resource_tracker._resource_tracker._fd = tracker  # type: ignore[attr-defined]
    conn = Connection(fd)

    async def serve() -> None:
        await _Helper(conn, owner).run()

    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv)
