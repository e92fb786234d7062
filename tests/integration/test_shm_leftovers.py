"""Shared-memory blocks of a killed worker: real processes, a real Redis, the real /dev/shm.

A worker's block is unlinked by its resource tracker when the worker alone is killed; when the
tracker dies with it (the whole process group killed), the next jobpulse process removes it
before it creates its first block. A block some live process holds is never removed."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobpulse import ProgressCell
from jobpulse._worker.arena import NAME_PREFIX, SHM_DIR
from tests.support import ROOT

pytestmark = pytest.mark.skipif(not Path(SHM_DIR).is_dir(), reason="no /dev/shm")


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes (each in a session of its own), every one killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _start(workers: list[subprocess.Popen[str]], url: str, ns: str, job: str) -> int:
    """A worker_proc holding ``job``'s heartbeat, in a new session (its resource tracker with
    it); returns its pid once the lease (and so its block) is held."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.worker_proc", url, ns, job, "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    workers.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    return proc.pid


def _blocks_of(pid: int) -> list[str]:
    return sorted(p.name for p in Path(SHM_DIR).glob(f"{NAME_PREFIX}{pid}_*"))


async def _stderr_at_eof(proc: subprocess.Popen[str]) -> str:
    """Everything the process and its children (the tracker) wrote to stderr, once all of them
    are gone (the pipe's last writer closed it)."""
    assert proc.stderr is not None
    return await asyncio.wait_for(asyncio.to_thread(proc.stderr.read), timeout=30)


async def test_a_killed_workers_block_is_unlinked_by_its_resource_tracker_with_a_warning(
    redis_url: str, ns: str, workers: list[subprocess.Popen[str]]
) -> None:
    pid = _start(workers, redis_url, ns, "killed-alone")
    assert len(_blocks_of(pid)) == 1
    os.kill(pid, signal.SIGKILL)  # the worker only: its tracker sees the pipe close
    workers[0].wait()
    stderr = await _stderr_at_eof(workers[0])
    assert "resource_tracker: There appear to be 1 leaked shared_memory objects" in stderr
    assert _blocks_of(pid) == []


async def test_a_block_whose_worker_and_tracker_were_killed_goes_with_the_next_worker(
    redis_url: str, ns: str, workers: list[subprocess.Popen[str]]
) -> None:
    pid = _start(workers, redis_url, ns, "killed-with-tracker")
    assert len(_blocks_of(pid)) == 1
    os.killpg(pid, signal.SIGKILL)  # the worker and its tracker at once: nobody unlinks
    workers[0].wait()
    stderr = await _stderr_at_eof(workers[0])
    assert "leaked shared_memory" not in stderr  # the tracker died before it could clean
    # the next jobpulse process removes it before it creates its own first block
    _start(workers, redis_url, ns, "next")
    assert _blocks_of(pid) == []


def test_a_block_a_live_process_holds_is_kept_whatever_pid_its_name_carries() -> None:
    # a live creator in another pid namespace sharing /dev/shm: its pid is not alive here
    path = Path(SHM_DIR, f"{NAME_PREFIX}999999999_{secrets.token_hex(6)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as a creator holds its block
        assert path.name not in ProgressCell.remove_leftovers()
        assert path.exists()
    finally:
        os.close(fd)  # the creator is gone: its lock with it
    ProgressCell.remove_leftovers()
    assert not path.exists()
