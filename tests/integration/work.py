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
