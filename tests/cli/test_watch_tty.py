"""``jobpulse watch`` in a pseudo-terminal (pexpect): the rich bar advances to 100 %, and turns
STALE (exit 5) when the worker process is SIGKILLed."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pexpect
import pytest

from .support import JOBPULSE, ROOT, env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def watch(url: str, ns: str, job: str) -> pexpect.spawn:
    return pexpect.spawn(
        JOBPULSE[0],
        [*JOBPULSE[1:], "watch", job, "--redis", url, "--namespace", ns, "--start-timeout", "60"],
        cwd=str(ROOT),
        env=env(TERM="xterm-256color", COLUMNS="200", LINES="30"),
        dimensions=(30, 200),
        encoding="utf-8",
        timeout=90,
    )


@contextlib.contextmanager
def worker(url: str, ns: str, job: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``tests.cli.job_proc`` in a process of its own, once its lease is held; killed at exit."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.cli.job_proc", url, ns, job, *args],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(b"ready")
            yield proc
        finally:
            proc.kill()


def percents(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"\b(\d{1,3})%", ANSI.sub("", text))]


def test_bar_advances_to_100_percent(redis_url: str, ns: str) -> None:
    child = watch(redis_url, ns, "tty-ok")
    try:
        child.expect("waiting for job tty-ok to start")
        with worker(redis_url, ns, "tty-ok", "60", "0.06", "complete") as proc:
            child.expect(pexpect.EOF)
            assert proc.wait(60) == 0
    finally:
        child.close(force=True)
    out = child.before + (child.after if isinstance(child.after, str) else "")
    seen = percents(out)
    assert seen[-1] == 100
    assert any(0 < p < 100 for p in seen), seen  # it advanced: intermediate values were drawn
    assert seen == sorted(seen)
    assert "COMPLETED" in out
    assert "\x1b[" in out  # drawn with terminal control codes: a live bar, not plain lines
    assert child.exitstatus == 0


def test_bar_turns_stale_when_the_worker_is_killed(redis_url: str, ns: str) -> None:
    with worker(redis_url, ns, "tty-dead", "1000000", "0.01", "hold") as proc:
        child = watch(redis_url, ns, "tty-dead")
        try:
            child.expect("RUNNING")
            proc.kill()  # SIGKILL: the heartbeat dies with the process
            proc.wait(30)
            child.expect("STALE")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
    assert child.exitstatus == 5
    assert "STALE: no heartbeat" in ANSI.sub("", child.before)
