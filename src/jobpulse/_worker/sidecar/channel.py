"""The owner's link to its sidecar helper: one helper process per owner process, one channel.

The helper is started on the first ``heartbeat(..., sidecar=True)`` of a process and serves
every later job of it. It is started as ``python -m jobpulse._worker.sidecar.helper`` (the
interpreter ``multiprocessing`` would use) with one end of a ``multiprocessing.Pipe`` — not
with a ``multiprocessing`` start method:

* ``fork`` copies a threaded owner (beat threads, a client's pool, a web server's threads):
  locks held by other threads at the fork stay held for ever in the child;
* ``spawn`` and ``forkserver`` re-run the owner's ``__main__`` module in the child (unless the
  user guarded it), which would start the user's work a second time;
* a tiny module entry imports only jobpulse, and is what ``spawn`` costs without the main
  module (docs/benchmarks.md has the start-up time).

Messages are pickled tuples (``Connection.send``). The owner sends requests (``start``, ``end``,
``checkpoint``, ``stats``: answered by ``("reply", rid, value, error)``) and one-way notes
(``client``, ``stage``); the helper sends ``("event", key, "interrupt", cause)`` when a job's
lease is lost or a cancel was requested. A daemon thread of the owner reads the helper's
messages; at end of file (the helper died) it fails every open request and tells every job
(:meth:`Channel.died`), so the owner notices a dead helper at once, never later than the next
``check()``. The helper watches the owner the other way (see :mod:`.helper`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import sys
import threading
from multiprocessing import Pipe, resource_tracker, spawn, util
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = ["Channel", "HelperDied", "Job", "channel"]

log = logging.getLogger("jobpulse")


class HelperDied(Exception):
    """The sidecar helper process exited (or was killed) while a request was open."""


class Job(Protocol):
    """What the channel calls on an owner-side job (from its reader thread)."""

    def _interrupted(self, cause: str | None) -> None: ...


class Channel:
    """One running helper process and the pipe to it."""

    def __init__(self) -> None:
        ours, theirs = Pipe(duplex=True)
        self.conn: Connection = ours
        tracker = _tracker_fd()
        fds = [theirs.fileno()] + ([tracker] if tracker >= 0 else [])
        exe = spawn.get_executable()
        argv = [exe, "-m", "jobpulse._worker.sidecar.helper"]
        argv += [str(theirs.fileno()), str(tracker), str(os.getpid())]
        try:
            self.pid: int = util.spawnv_passfds(exe, argv, fds)  # type: ignore[arg-type]
        finally:
            theirs.close()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._client_lock = threading.Lock()  # never taken by the reader thread
        self._ids = itertools.count(1)
        self._open: dict[int, concurrent.futures.Future[Any]] = {}
        self.jobs: dict[int, Job] = {}
        self._clients: dict[bytes, int] = {}  # the pickled factory -> the helper's client id
        self.dead: str | None = None
        self.send(("hello", list(sys.path)))
        self._reader = threading.Thread(target=self._read, name="jobpulse-sidecar", daemon=True)
        self._reader.start()

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one message (any thread). Raises :class:`HelperDied` once the helper is gone."""
        if self.dead is not None:
            raise HelperDied(self.dead)
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError) as exc:
            raise HelperDied(f"the sidecar helper (pid {self.pid}) is gone: {exc!r}") from exc

    def request(self, kind: str, *args: Any) -> concurrent.futures.Future[Any]:
        """Send ``(kind, rid, *args)``; the future gets the helper's answer."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            rid = next(self._ids)
            self._open[rid] = future
        try:
            self.send((kind, rid, *args))
        except HelperDied as exc:
            with self._lock:
                self._open.pop(rid, None)
            future.set_exception(exc)
        return future

    def client_id(self, client: Any, factory: bytes) -> int:
        """The helper's id of the client ``factory`` rebuilds: each distinct factory is sent
        once, so clients of the same settings share one client in the helper, and a client made
        per job costs the helper nothing new (neither side holds the caller's client object).

        The factory goes out under the lock that assigns its id: a job of another thread that
        finds the id can only send its ``start`` after it, so the helper always knows the id.
        (Not ``_lock``: the reader thread takes that one, and a send blocked on a full pipe
        while it waited would stop the replies that drain the helper's side.)
        """
        with self._client_lock:
            known = self._clients.get(factory)
            if known is not None:
                return known
            cid = len(self._clients) + 1
            self.send(("client", cid, factory))
            self._clients[factory] = cid
        return cid

    def new_key(self) -> int:
        with self._lock:
            return next(self._ids)

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.died(f"the sidecar helper (pid {self.pid}) exited")
                return
            except Exception as exc:  # a message we cannot load: a bug, never a silent hang
                log.exception("jobpulse: unreadable message from the sidecar helper")
                self.died(f"unreadable message from the sidecar helper: {exc!r}")
                return
            if message[0] == "reply":
                _, rid, value, error = message
                with self._lock:
                    future = self._open.pop(rid, None)
                if future is not None and not future.done():
                    if error is None:
                        future.set_result(value)
                    else:
                        future.set_exception(error)
            elif message[0] == "event":
                _, key, _kind, cause = message
                job = self.jobs.get(key)
                if job is not None:
                    job._interrupted(cause)

    def died(self, reason: str) -> None:
        """The helper is gone: fail open requests, interrupt every job (each raises ``LeaseLost``
        with cause ``SIDECAR_DIED`` at its exit), and let the next job start a new helper."""
        with self._lock:
            if self.dead is not None:
                return
            self.dead = reason
            opened, self._open = self._open, {}
            jobs = list(self.jobs.values())
        global _CHANNEL
        with _START:
            if _CHANNEL is self:
                _CHANNEL = None
        if jobs:
            log.error("jobpulse: %s; its %d running job(s) stop (lease lost)", reason, len(jobs))
        for future in opened.values():
            if not future.done():
                future.set_exception(HelperDied(reason))
        for job in jobs:
            job._interrupted("SIDECAR_DIED")
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(OSError):  # reap it (no zombie); it has closed its pipe: exiting
            os.waitpid(self.pid, 0)

    def __repr__(self) -> str:
        dead = self.dead is not None
        return f"<sidecar Channel pid={self.pid} jobs={len(self.jobs)} dead={dead}>"


_START = threading.Lock()
_CHANNEL: Channel | None = None


def channel() -> Channel:
    """This process's helper, started on first use (and again after one died)."""
    global _CHANNEL
    with _START:
        if _CHANNEL is None or _CHANNEL.dead is not None:
            _CHANNEL = Channel()
        return _CHANNEL


def helper_pid() -> int | None:
    """The pid of this process's running helper, if one runs (for tests and the demo)."""
    current = _CHANNEL
    return None if current is None or current.dead is not None else current.pid


def _tracker_fd() -> int:
    """The owner's ``multiprocessing`` resource tracker (the helper shares it, as a spawned
    child would: no tracker process of its own)."""
    try:
        resource_tracker.ensure_running()
        fd = resource_tracker.getfd()
        return -1 if fd is None else int(fd)
    except Exception:  # no tracker here: the helper starts its own on first use
        return -1


def _after_fork_in_child() -> None:
    """A forked child is a new owner: it never uses its parent's helper (whose pipe end it
    inherited: closed here, so the helper still sees the parent's exit as end of file)."""
    global _CHANNEL, _START
    _START = threading.Lock()
    old, _CHANNEL = _CHANNEL, None
    if old is not None:
        old.dead = "the parent's helper (this process was forked)"
        with contextlib.suppress(OSError):
            old.conn.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
