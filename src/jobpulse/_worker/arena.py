"""Shared-memory blocks that hold many progress cells: a few file descriptors per process,
not two per job (10,000 jobs in one process would otherwise need 20,000 descriptors).

A block is one ``multiprocessing.shared_memory`` segment named ``jobpulse_<pid>_<random>`` with
``CELLS`` cells. Cells are handed out in order and never reused: a computation that still runs
after its job ended may go on writing its old cell, and must never count for a new job. A block
is unlinked as soon as none of its cells is live (so nothing is left behind after the jobs); its
mapping lives on, in every process, until the last view of it is released.

The arena is process-wide state, like an allocator: a forked child starts with an empty one.

A block whose creator was killed while one of its jobs ran is unlinked by the creator's
``multiprocessing`` resource tracker (which then prints its "leaked shared_memory objects"
warning) — unless the tracker was killed too (a whole process group or container killed at once;
RQ's stop-job command kills the work horse's group). For that case the creator holds a shared
``flock`` on its block for as long as the block is mapped in it (the lock goes with the
descriptor the mmap keeps; the kernel drops it when the process dies, whatever killed it), and
each process, before it creates its first block, unlinks every ``jobpulse_*`` block that no live
process holds that way and whose creator pid is not alive here (:func:`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import weakref
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from .owner import pid_alive

try:
    import fcntl
except ImportError:  # pragma: no cover - no flock (Windows): no leftover sweep either
    fcntl = None  # type: ignore[assignment]

__all__ = ["CELLS", "NAME_PREFIX", "SHM_DIR", "Block", "allocate", "attach", "release"]

log = logging.getLogger("jobpulse")

SHM_DIR = "/dev/shm"
"""Where Linux keeps the names of POSIX shared memory (elsewhere nothing is swept)."""

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
        self.swept = False  # leftovers of dead processes removed (before this process's 1st block)


_ARENA = _Arena()
os.register_at_fork(after_in_child=lambda: _ARENA.__init__())  # type: ignore[misc]


def allocate(ints: int) -> tuple[Block, int]:
    """A new cell of ``ints`` int64 slots, zeroed: ``(block, index)``."""
    block = _ARENA.current
    if block is None or block.handed_out == CELLS:
        if not _ARENA.swept:
            _ARENA.swept = True
            _sweep()
        block = Block(_create(CELLS * ints * 8))
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


def _create(size: int) -> shared_memory.SharedMemory:
    """A new block, held with a shared ``flock`` (see the module's docstring).

    The creator's resource tracker unlinks the block should this process be killed (its tracker
    living on). A sweep of a process that does not see this pid alive (another pid namespace)
    may take the block between its creation and the lock; the lock is then refused (never
    waited for) or the name is found gone, and the block is dropped and another one made.
    """
    while True:
        name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        fd = shm._fd  # type: ignore[attr-defined]
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # a sweep holds it: drop it
        except OSError:  # a file system without flock: no protection, no sweep needed either
            return shm
        else:
            if os.fstat(fd).st_nlink > 0:
                return shm
        shm.close()
        try:
            shm.unlink()  # also tells the resource tracker
        except FileNotFoundError:  # the sweep unlinked it: the tracker must not try at exit
            with contextlib.suppress(Exception):
                resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]


def _sweep() -> None:
    """Remove leftovers before this process creates its first block; never fails the caller."""
    try:
        removed = remove_leftovers(SHM_DIR)
    except Exception as exc:  # a sweep is housekeeping: the job goes on without it
        log.warning("jobpulse: could not remove leftover shared memory: %r", exc)
        return
    if removed:
        log.info("jobpulse: removed %d leftover shared-memory block(s): %s", len(removed), removed)


def remove_leftovers(directory: str = SHM_DIR) -> list[str]:
    """Unlink the ``jobpulse_*`` blocks in ``directory`` whose creator is gone.

    A block is a leftover when no process holds it locked (its creator died; see the module's
    docstring) and the creator pid in its name is not alive in this pid namespace — both, so a
    live creator in another pid namespace sharing ``/dev/shm`` (containers of one pod), and one
    of an earlier jobpulse that took no lock, are never touched. Returns the names removed.
    """
    removed = []
    for path in Path(directory).glob(f"{NAME_PREFIX}*"):
        pid_text = path.name.removeprefix(NAME_PREFIX).split("_", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        if _unlink_unlocked(path):
            removed.append(path.name)
    return removed


def _unlink_unlocked(path: Path) -> bool:
    """Unlink ``path`` if no process holds a lock on it; True when this call unlinked it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live process holds it
        # still the file we locked (not unlinked and made anew by someone else meanwhile)
        if os.fstat(fd).st_nlink == 0:
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)  # drops our lock
