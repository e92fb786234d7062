"""Helpers of the CLI tests: run ``jobpulse`` and the worker processes as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOBPULSE = [sys.executable, "-m", "jobpulse"]


@dataclass
class Result:
    code: int
    out: str
    err: str


def env(**extra: str) -> dict[str, str]:
    """The test process's environment without REDIS_URL, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    base.update(extra)
    return base


async def cli(*args: str, timeout: float = 90.0, environ: dict[str, str] | None = None) -> Result:
    """Run ``python -m jobpulse ARGS`` to its end (output captured, not a terminal)."""
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE,
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ if environ is not None else env(),
        cwd=ROOT,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


class Worker:
    """A job run by ``tests.cli.job_proc`` (or ``tests.integration.worker_proc``) in a process
    of its own; ``await Worker.start(...)`` returns once its lease is held."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls,
        url: str,
        ns: str,
        job: str,
        total: int = 20,
        step: float = 0.05,
        outcome: str = "complete",
    ) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.cli.job_proc",
            url,
            ns,
            job,
            str(total),
            str(step),
            outcome,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env(),
        )
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
        assert line.startswith(b"ready"), line
        return cls(proc)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()

    async def wait(self, timeout: float = 60.0) -> int:
        async with asyncio.timeout(timeout):
            return await self.proc.wait()

    async def close(self) -> None:
        self.kill()
        await self.proc.wait()
