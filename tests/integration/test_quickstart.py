"""docs/quickstart.md runs top to bottom as written: its script, extracted from the page, runs
its job to COMPLETED under the ``spawn`` start method (macOS and Windows) and ``fork`` (Linux up
to 3.13), and ``jobpulse status`` then shows it, as the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
