"""ProgressCell: progress counters in shared memory, updated by the computation for almost nothing.

Layout of the block (little-endian int64 slots)::

    [0] magic   [1] total (-1: unknown)   [2] cancelled (0/1)   [3] lanes handed out
    [4..7] reserved
    [8 .. 8+LANES) one ``done`` counter per lane

A lane has one writer. The cell the heartbeat creates writes lane 0. Every copy that crosses a
process boundary (pickled by ``run_in_executor`` on a ProcessPoolExecutor, fork or spawn) is
handed the next lane when it is pickled, so processes never race on one counter. The job's
``done`` is the sum of all lanes. Threads share one Python object and therefore one lane: under
CPython's GIL ``advance()`` from several threads is counted exactly (tested); on a
free-threaded build give each thread its own lane with :meth:`ProgressCell.lane`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

from ..errors import JobCancelled

__all__ = ["LANES", "NAME_PREFIX", "ProgressCell"]

NAME_PREFIX = "jobpulse_"
"""Every block is named ``jobpulse_<creator pid>_<random>`` so leftovers can be found."""

LANES = 256
_MAGIC = 0x6A70756C7365  # "jpulse"
_TOTAL, _CANCELLED, _LANES_USED, _FIRST = 1, 2, 3, 8
_SIZE = (_FIRST + LANES) * 8


def _open(name: str) -> shared_memory.SharedMemory:
    """Attach to an existing block without handing its lifetime to a tracker of our own.

    Python < 3.13 registers every attach with the resource tracker. A process that shares its
    creator's tracker (spawned or forked pool workers do) re-registers a name already there: a
    no-op. A process with a tracker of its own (forked before the creator's tracker started)
    would have that tracker unlink the block when it exits, so there we unregister at once.
    """
    shared = getattr(resource_tracker._resource_tracker, "_fd", None) is not None
    shm = shared_memory.SharedMemory(name=name)
    if not shared:
        with contextlib.suppress(Exception):
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


class ProgressCell:
    """Progress of one job, in shared memory.

    Pass it as a plain argument to a function run by ``loop.run_in_executor(...)`` on a
    ThreadPoolExecutor or a ProcessPoolExecutor; call :meth:`advance` or :meth:`set` there.
    Updates do no I/O and take no lock; the heartbeat reads the cell once per beat.

    Args:
        total: the number of items, or None when unknown.
    """

    __slots__ = ("__weakref__", "_creator", "_lane", "_n", "_shm", "_v")

    def __init__(self, total: int | None = None) -> None:
        _check_total(total)
        name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        # The creator's resource tracker unlinks the block should this process be killed.
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=_SIZE)
        self._v: memoryview = _view(self._shm)
        self._v[0] = _MAGIC
        self._v[_TOTAL] = -1 if total is None else total
        self._v[_LANES_USED] = 1
        self._lane = _FIRST
        self._n = 0
        self._creator = True

    @classmethod
    def _attach(cls, name: str, lane: int) -> ProgressCell:
        self = cls.__new__(cls)
        self._shm = _open(name)
        self._v = _view(self._shm)
        if self._v[0] != _MAGIC:
            raise ValueError(f"shared memory block {name!r} is not a jobpulse ProgressCell")
        self._lane = lane
        self._n = self._v[lane]
        self._creator = False
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        return (ProgressCell._attach, (self._shm.name, self._next_lane()))

    def _next_lane(self) -> int:
        used = self._v[_LANES_USED]
        self._v[_LANES_USED] = used + 1
        return _FIRST + used % LANES

    def lane(self) -> ProgressCell:
        """A view of this cell with a lane of its own (one per thread on free-threaded builds)."""
        return ProgressCell._attach(self._shm.name, self._next_lane())

    # -- the hot path: no I/O, no lock, one shared-memory store --------------------------------

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self._n += n
        self._v[self._lane] = self._n

    def set(self, done: int) -> None:
        """Set this lane's count of items done (the job's ``done`` is the sum of all lanes)."""
        self._n = done
        self._v[self._lane] = done

    def set_total(self, total: int | None) -> None:
        """Set (or, with None, forget) the total number of items.

        Raises:
            ValueError: ``total`` is negative.
        """
        _check_total(total)
        self._v[_TOTAL] = -1 if total is None else total

    @property
    def cancelled(self) -> bool:
        """True once the job must stop (remote cancel or lease lost)."""
        return self._v[_CANCELLED] != 0

    def check(self) -> None:
        """Raise :class:`~jobpulse.JobCancelled` once the job must stop; else return at once."""
        if self._v[_CANCELLED]:
            raise JobCancelled("the job was cancelled or its lease was lost; stop the work")

    # -- the heartbeat's side --------------------------------------------------------------------

    @property
    def done(self) -> int:
        """Items done: the sum over every lane."""
        used = min(self._v[_LANES_USED], LANES)
        return sum(self._v[_FIRST : _FIRST + used])

    @property
    def total(self) -> int | None:
        """The total number of items, or None when unknown."""
        total = self._v[_TOTAL]
        return None if total < 0 else total

    @property
    def name(self) -> str:
        """The shared-memory block's name (``jobpulse_<pid>_<random>``)."""
        return self._shm.name

    def _cancel(self) -> None:
        self._v[_CANCELLED] = 1

    def _unlink(self) -> None:
        """Remove the block's name; the mapping lives on until the last view is collected."""
        if not self._creator:
            return
        self._creator = False
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()

    def __del__(self) -> None:
        # Release our view before closing, or close() refuses (exported buffer).
        with contextlib.suppress(Exception):
            self._v.release()
            self._shm.close()

    def __repr__(self) -> str:
        return (
            f"<ProgressCell {self.name} done={self.done} total={self.total} "
            f"cancelled={self.cancelled}>"
        )

    @staticmethod
    def remove_leftovers(directory: str = "/dev/shm") -> list[str]:
        """Unlink blocks left behind by jobpulse processes that no longer exist.

        A block outlives its job only when the process that created it was killed before its
        ``heartbeat`` exited. Returns the names removed (Linux keeps them in ``/dev/shm``).
        """
        removed = []
        for path in Path(directory).glob(f"{NAME_PREFIX}*"):
            pid_text = path.name.removeprefix(NAME_PREFIX).split("_", 1)[0]
            if not pid_text.isdigit() or _pid_alive(int(pid_text)):
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
        return removed


def _view(shm: shared_memory.SharedMemory) -> memoryview:
    buf = shm.buf
    assert buf is not None
    return buf.cast("q")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_total(total: object) -> None:
    if total is None:
        return
    if isinstance(total, bool) or not isinstance(total, int):
        raise TypeError(f"total must be an int or None, got {type(total).__name__}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
