"""``jobpulse watch`` in a pseudo-terminal (pexpect): the rich bar advances to 100 %, and turns
STALE (exit 5) when the worker process is SIGKILLed; in an 80-column tmux pane, it draws one line
per job with the whole id, as the terminal shows it."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
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


def pane(session: str) -> list[str]:
    """The lines of the tmux pane as the terminal shows them (wrapped rows are several lines)."""
    out = subprocess.run(
        ["tmux", "-L", session, "capture-pane", "-p", "-t", session],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line.rstrip() for line in out.stdout.splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize(
    "job", ["tty-80", f"saq:job:default:{uuid.UUID(int=0x3F2A9C1E7B)}"], ids=["short", "saq"]
)
def test_bar_fits_an_80_column_terminal_on_one_line(redis_url: str, ns: str, job: str) -> None:
    """The row of a running job (a count of 7 digits, a 52-character queue id) on an 80-column
    screen: one line holding the whole id, the percent and the state. It wrapped onto three
    lines and cut the id before the layout followed the width."""
    session = f"jp-{os.getpid()}-{len(job)}"
    argv = [*JOBPULSE, "watch", job, "--redis", redis_url, "--namespace", ns]
    environ = {k: v for k, v in env(TERM="xterm-256color").items() if k not in ("COLUMNS", "LINES")}
    with worker(redis_url, ns, job, "1000000", "0.01", "hold"):
        subprocess.run(
            ["tmux", "-L", session, "-f", os.devnull, "new-session", "-d", "-s", session,
             "-x", "80", "-y", "24", shlex.join(argv)],
            cwd=ROOT, env=environ, check=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            lines = pane(session)
            while not any("RUNNING" in line for line in lines):  # the first frame is drawn
                assert time.monotonic() < deadline, lines
                time.sleep(0.1)
                lines = pane(session)
            time.sleep(0.5)  # a few more frames, with rate and ETA known
            lines = pane(session)
        finally:
            subprocess.run(["tmux", "-L", session, "kill-server"], check=False)
    assert len(lines) == 1, lines
    assert lines[0].startswith(job + " "), lines
    assert "%" in lines[0]
    assert lines[0].endswith("RUNNING"), lines
