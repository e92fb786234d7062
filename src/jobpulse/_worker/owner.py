"""Owner watch: copies of a progress cell in other processes stop once its owner is gone.

The process that created a cell (the one running ``async with heartbeat(...)``) marks the cell
cancelled when the job ends. When that process dies instead (SIGKILL, OOM, a SIGTERM it does
not handle) nobody would, and executor children would compute for ever with no lease. So every
process that unpickles a cell of another process watches that owner: one daemon thread per
process waits on a ``pidfd`` per owner (Linux >= 5.3; elsewhere it polls ``kill(pid, 0)``) and
sets the cancelled slot of every live copy as soon as the owner exits, within ``POLL`` seconds.

The computation's hot path is untouched: ``advance()`` and ``cancelled`` stay one shared-memory
access; the thread only writes the slot they already read.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import weakref
from collections.abc import Callable

__all__ = ["POLL", "pid_alive", "watch_owner"]

POLL = 0.25
"""Seconds between two looks at the owners (a pidfd wakes the thread at once)."""

Cancel = Callable[[], None]


class _Watch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owners: dict[int, list[weakref.ref[object]]] = {}  # pid -> the copies it owns
        self.fds: dict[int, int] = {}  # pid -> pidfd (when the platform has them)
        self.thread: threading.Thread | None = None

    def add(self, pid: int, copy: object) -> bool:
        """Watch ``pid`` for ``copy``; False when ``pid`` is already gone."""
        with self.lock:
            if pid not in self.owners:
                fd = _pidfd(pid)
                if fd == -2:
                    return False
                if fd >= 0:
                    self.fds[pid] = fd
                self.owners[pid] = []
            self.owners[pid].append(weakref.ref(copy))
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="jobpulse-owner-watch", daemon=True
                )
                self.thread.start()
        return True

    def _run(self) -> None:
        while True:
            with self.lock:
                for pid in [p for p, refs in self.owners.items() if not _prune(refs)]:
                    self._forget(pid)
                if not self.owners:
                    self.thread = None  # the next add() starts a new one
                    return
                pids = list(self.owners)
                fds = dict(self.fds)
            gone = _wait_gone(pids, fds, POLL)
            with self.lock:
                for pid in gone:
                    for ref in self.owners.get(pid, []):
                        copy = ref()
                        if copy is not None:
                            copy._cancel()  # type: ignore[attr-defined]
                    self._forget(pid)

    def _forget(self, pid: int) -> None:
        self.owners.pop(pid, None)
        fd = self.fds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def reset_after_fork(self) -> None:
        """A forked child has no watch thread: start over (the next add() starts one)."""
        self.lock = threading.Lock()
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.owners, self.fds, self.thread = {}, {}, None


_WATCH = _Watch()
os.register_at_fork(after_in_child=_WATCH.reset_after_fork)


def watch_owner(pid: int, copy: object) -> bool:
    """Call ``copy._cancel()`` once process ``pid`` has exited (at once if it already has).

    The watch holds ``copy`` weakly. Returns False when ``pid`` was already gone.
    """
    if _WATCH.add(pid, copy):
        return True
    copy._cancel()  # type: ignore[attr-defined]
    return False


def _prune(refs: list[weakref.ref[object]]) -> bool:
    refs[:] = [r for r in refs if r() is not None]
    return bool(refs)


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid``; -1 when the platform has none (poll by signal 0), -2 when gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is not None:
        try:
            return int(opener(pid))
        except ProcessLookupError:
            return -2
        except OSError:
            pass  # no pidfd support in this kernel or sandbox
    return -1 if pid_alive(pid) else -2


def _wait_gone(pids: list[int], fds: dict[int, int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s; return the pids that have exited."""
    if fds:
        poller = select.poll()
        for fd in fds.values():
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout * 1000)}
        gone = [pid for pid, fd in fds.items() if fd in ready]
        if len(fds) == len(pids):
            return gone
    else:
        threading.Event().wait(timeout)
        gone = []
    return gone + [pid for pid in pids if pid not in fds and not pid_alive(pid)]


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this pid namespace (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
