"""Executor functions for the tests: importable by spawned processes."""

from __future__ import annotations

import hashlib
import os
import signal
import time

from jobpulse import JobCancelled, ProgressCell


def hash_items(cell: ProgressCell, n: int, item_seconds: float = 0.0) -> int:
    """Hash n items, advancing the cell once per item; stops when the job is cancelled."""
    digest = b""
    for _ in range(n):
        if cell.cancelled:
            raise JobCancelled("stopped")
        deadline = time.perf_counter() + item_seconds
        digest = hashlib.sha256(digest).digest()
        while time.perf_counter() < deadline:
            digest = hashlib.sha256(digest).digest()
        cell.advance()
    return len(digest)


def until_cancelled(cell: ProgressCell, limit: float = 60.0) -> str:
    """Advance until the cell says cancelled; returns 'cancelled' or 'timeout'."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cell.cancelled:
            return "cancelled"
        cell.advance()
        time.sleep(0.01)
    return "timeout"


def pid_then_wait(cell: ProgressCell, seconds: float) -> int:
    cell.advance()
    time.sleep(seconds)
    return os.getpid()


def kill_self(cell: ProgressCell) -> None:
    cell.advance()
    os.kill(os.getpid(), signal.SIGKILL)


def set_chunk(cell: ProgressCell, n: int) -> None:
    """One chunk of ``n`` items that reports with ``set`` (this copy's count)."""
    for i in range(1, n + 1):
        cell.set(i)


def advance_chunk(cell: ProgressCell, n: int) -> None:
    """One chunk of ``n`` items, one ``advance`` each."""
    for _ in range(n):
        cell.advance()


def check_until_stopped(cell: ProgressCell, marker: str) -> None:
    """Loop on ``cell.check()``; once it raises, write the time (monotonic) to ``marker``.

    The marker appears whole (written beside it, then renamed): a test polls for it and reads
    it at once, and a file opened for writing exists, empty, before its content is written
    (read that way once in a random-order run of the suite)."""
    try:
        while True:
            cell.check()
            cell.advance()
            time.sleep(0.001)
    except JobCancelled:
        partial = f"{marker}.partial"
        with open(partial, "w") as f:
            f.write(f"{time.monotonic()} {os.getpid()}")
        os.replace(partial, marker)
        raise
