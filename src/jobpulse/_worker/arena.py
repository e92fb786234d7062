"""Shared-memory blocks that hold many progress cells: a few file descriptors per process,
not two per job (10,000 jobs in one process would otherwise need 20,000 descriptors).

A block is one ``multiprocessing.shared_memory`` segment named ``jobpulse_<pid>_<random>`` with
``CELLS`` cells. Cells are handed out in order and never reused: a computation that still runs
after its job ended may go on writing its old cell, and must never count for a new job. A block
is unlinked as soon as none of its cells is live (so nothing is left behind after the jobs); its
mapping lives on, in every process, until the last view of it is released.

The arena is process-wide state, like an allocator: a forked child starts with an empty one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import weakref
from multiprocessing import resource_tracker, shared_memory

__all__ = ["CELLS", "NAME_PREFIX", "Block", "allocate", "attach", "release"]

NAME_PREFIX = "jobpulse_"
"""Every block is named ``jobpulse_<creator pid>_<random>`` so leftovers can be found."""

CELLS = 128
"""Cells per block."""


class Block:
    """One mapped block. Cells hold a reference to it.

    The mapping is owned by the views alone: the ``SharedMemory`` object is detached from it at
    once (its descriptor closed, its buffer and mmap handed to our view), so that nothing ever
    calls ``close()`` on a mapping a computation may still be writing, and the mapping is freed
    by reference counting after the last view — in any order, also at interpreter exit.
    """

    __slots__ = ("__weakref__", "handed_out", "live", "name", "shm", "view")

    def __init__(self, shm: shared_memory.SharedMemory) -> None:
        self.shm = shm
        self.name: str = shm.name
        buf = shm.buf
        assert buf is not None
        self.view: memoryview = buf.cast("q")
        # Detach: SharedMemory.close() (also run by its __del__) would refuse, or worse, unmap.
        shm._buf = None  # type: ignore[attr-defined]
        shm._mmap = None  # type: ignore[attr-defined]
        os.close(shm._fd)  # type: ignore[attr-defined]  # the mmap keeps a descriptor of its own
        shm._fd = -1  # type: ignore[attr-defined]
        self.handed_out = 0  # cells allocated so far (creator only)
        self.live = 0  # cells allocated and not released yet (creator only)


class _Arena:
    def __init__(self) -> None:
        self.current: Block | None = None  # the block new cells come from
        self.owned: dict[str, Block] = {}  # blocks this process created, with live cells
        self.attached: weakref.WeakValueDictionary[str, Block] = weakref.WeakValueDictionary()


_ARENA = _Arena()
os.register_at_fork(after_in_child=lambda: _ARENA.__init__())  # type: ignore[misc]


def allocate(ints: int) -> tuple[Block, int]:
    """A new cell of ``ints`` int64 slots, zeroed: ``(block, index)``."""
    block = _ARENA.current
    if block is None or block.handed_out == CELLS:
        name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        # The creator's resource tracker unlinks the block should this process be killed.
        block = Block(shared_memory.SharedMemory(name=name, create=True, size=CELLS * ints * 8))
        _ARENA.current = _ARENA.owned[block.name] = block
    index = block.handed_out
    block.handed_out += 1
    block.live += 1
    return block, index


def release(block: Block) -> None:
    """A cell of ``block`` is done; unlink the block's name once none of its cells is live."""
    block.live -= 1
    if block.live > 0:
        return
    _ARENA.owned.pop(block.name, None)
    if _ARENA.current is block:
        _ARENA.current = None
    with contextlib.suppress(FileNotFoundError):
        block.shm.unlink()


def attach(name: str) -> Block:
    """The block ``name``, mapped once per process however many cells of it arrive."""
    block = _ARENA.owned.get(name) or _ARENA.attached.get(name)
    if block is None:
        block = _ARENA.attached[name] = Block(_open(name))
    return block


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
