"""docs/quickstart.md runs top to bottom as written: its script, extracted from the page, runs
its job to COMPLETED under the ``spawn`` start method (macOS and Windows) and ``fork`` (Linux up
to 3.13), and ``jobpulse status`` then shows it; ``jobpulse cancel`` ends it CANCELLED; killed,
it turns STALE and stays so until ``jobpulse sweep`` claims it (LOST), as the page says."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobpulse import JobState
from jobpulse._provision import RedisServer
from jobpulse.sync import StatusReader
from tests.support import ROOT

PAGE = ROOT / "docs" / "quickstart.md"


def quickstart_script() -> str:
    """The page's one Python block under "Put a job under a heartbeat"."""
    section = PAGE.read_text().split("## Put a job under a heartbeat", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


@pytest.fixture
def own_redis() -> Iterator[dict[str, str]]:
    """A Redis of the test's own, as ``REDIS_URL`` (the script's job id is fixed)."""
    server = RedisServer().start()
    try:
        yield {**os.environ, "REDIS_URL": server.url}
    finally:
        server.close()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_quickstart_script_runs_as_written(
    method: str, own_redis: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "quickstart.py"
    # the platform's default start method, as the page's reader has it; the script itself as written
    head = f"import multiprocessing; multiprocessing.set_start_method({method!r}, force=True)\n"
    script.write_text(head + quickstart_script())
    run = subprocess.run(
        [sys.executable, str(script), "20"],
        cwd=tmp_path, env=own_redis, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("report-42 COMPLETED: "), (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr

    client = redis.Redis.from_url(own_redis["REDIS_URL"])
    try:
        status = StatusReader(client).get("report-42")
    finally:
        client.close()
    assert (status.state, status.done, status.total, status.attempt) == (
        JobState.COMPLETED, 20, 20, 1,
    )  # fmt: skip

    shown = subprocess.run(
        [sys.executable, "-m", "jobpulse", "status", "report-42"],
        cwd=ROOT, env=own_redis, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown
    assert "COMPLETED" in shown.stdout


def jobpulse(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobpulse", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@contextlib.contextmanager
def long_job(env: dict[str, str], tmp_path: Path, stdout: int) -> Iterator[subprocess.Popen[str]]:
    """The page's script with its default 30 s job, yielded once the job is RUNNING; every
    process of its session (the script, its pool processes) is killed at the end."""
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_script())
    with subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path, env=env, stdout=stdout, text=True, start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            wait_running(env, proc)
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a pool process may outlive a killed owner
            proc.communicate()


def wait_running(env: dict[str, str], proc: subprocess.Popen[str]) -> None:
    client = redis.Redis.from_url(env["REDIS_URL"])
    try:
        reader = StatusReader(client, cache_ttl=0)
        deadline = time.monotonic() + 60
        while reader.get("report-42").state is not JobState.RUNNING:
            assert proc.poll() is None, "the script ended before its job ran"
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.05)
    finally:
        client.close()


def test_jobpulse_cancel_ends_the_quickstart_job_cancelled(
    own_redis: dict[str, str], tmp_path: Path
) -> None:
    with long_job(own_redis, tmp_path, subprocess.PIPE) as proc:
        status = jobpulse(own_redis, "status", "report-42")
        assert status.returncode == 0, status
        assert "RUNNING" in status.stdout
        assert jobpulse(own_redis, "cancel", "report-42").returncode == 0
        assert proc.stdout is not None
        out = proc.stdout.readline()
        assert proc.wait(60) == 0
    assert out == "report-42 CANCELLED\n"
    assert jobpulse(own_redis, "watch", "report-42").returncode == 3  # CANCELLED


def test_a_killed_quickstart_job_stays_stale_until_a_sweeper_claims_it(
    own_redis: dict[str, str], tmp_path: Path
) -> None:
    with long_job(own_redis, tmp_path, subprocess.DEVNULL) as proc:
        proc.send_signal(signal.SIGKILL)  # the script only: its pool process is left orphaned
        proc.wait()
    # watch follows it until it settles: STALE (exit 5) within the 6 s lease
    assert jobpulse(own_redis, "watch", "report-42").returncode == 5
    assert jobpulse(own_redis, "watch", "report-42").returncode == 5  # nobody claims it
    # the page's sweeper: it claims the job once its index entry is past its deadline
    with subprocess.Popen(
        [sys.executable, "-m", "jobpulse", "sweep", "--loop", "--period", "0.5"],
        cwd=ROOT, env=own_redis, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as sweeper:  # fmt: skip
        try:
            assert sweeper.stdout is not None
            claimed = sweeper.stdout.readline()
        finally:
            sweeper.terminate()
    assert claimed.startswith("claimed report-42: attempt 1 "), claimed
    assert jobpulse(own_redis, "watch", "report-42").returncode == 4  # LOST
