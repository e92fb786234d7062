"""ProgressCell: progress counters in shared memory, updated by the computation for almost nothing.

A cell is a slice of a shared-memory block (see :mod:`.arena`: many cells per block). Its
layout, in int64 slots::

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
from pathlib import Path
from typing import Any

from ..errors import JobCancelled
from .arena import NAME_PREFIX, Block, allocate, attach, release

__all__ = ["LANES", "NAME_PREFIX", "ProgressCell"]

LANES = 64
_MAGIC = 0x6A70756C7365  # "jpulse"
_TOTAL, _CANCELLED, _LANES_USED, _FIRST = 1, 2, 3, 8
_INTS = _FIRST + LANES


class ProgressCell:
    """Progress of one job, in shared memory.

    Pass it as a plain argument to a function run by ``loop.run_in_executor(...)`` on a
    ThreadPoolExecutor or a ProcessPoolExecutor; call :meth:`advance` or :meth:`set` there.
    Updates do no I/O and take no lock; the heartbeat reads the cell once per beat.

    Args:
        total: the number of items, or None when unknown.
    """

    __slots__ = ("__weakref__", "_block", "_creator", "_index", "_lane", "_n", "_v")

    def __init__(self, total: int | None = None) -> None:
        _check_total(total)
        self._block, self._index = allocate(_INTS)
        self._v: memoryview = _slice(self._block, self._index)
        self._v[0] = _MAGIC
        self._v[_TOTAL] = -1 if total is None else total
        self._v[_LANES_USED] = 1
        self._lane = _FIRST
        self._n = 0
        self._creator = True

    @classmethod
    def _attach(cls, name: str, index: int, lane: int) -> ProgressCell:
        self = cls.__new__(cls)
        self._block, self._index = attach(name), index
        self._v = _slice(self._block, index)
        if self._v[0] != _MAGIC:
            raise ValueError(f"{name!r} cell {index} is not a jobpulse ProgressCell")
        self._lane = lane
        self._n = self._v[lane]
        self._creator = False
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, int, int]]:
        return (ProgressCell._attach, (self.name, self._index, self._next_lane()))

    def _next_lane(self) -> int:
        used = self._v[_LANES_USED]
        self._v[_LANES_USED] = used + 1
        return _FIRST + used % LANES

    def lane(self) -> ProgressCell:
        """A view of this cell with a lane of its own (one per thread on free-threaded builds)."""
        return ProgressCell._attach(self.name, self._index, self._next_lane())

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
        """The name of the shared-memory block holding the cell (``jobpulse_<pid>_<random>``)."""
        return self._block.name

    def _cancel(self) -> None:
        self._v[_CANCELLED] = 1

    def _unlink(self) -> None:
        """The job is over: its block is unlinked once none of its cells is live. The mapping
        lives on until the last view is released (a computation may still be writing)."""
        if self._creator:
            self._creator = False
            release(self._block)

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


def _slice(block: Block, index: int) -> memoryview:
    return block.view[index * _INTS : (index + 1) * _INTS]


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
