"""Every example runs as its docstring says. A queue example both ways, as written there: the
script alone, and the production commands (the queue's own worker command in one process,
``--send`` in another, then ``jobpulse watch`` on the printed id, which exits 0 once the job
COMPLETED); the process-pool and FastAPI examples as scripts; the Dramatiq page's snippets.

The commands are read from the docstrings, so the docs and this test cannot drift apart. Each test
has a Redis of its own (``REDIS_URL`` points the example at it), so the examples' fixed queue
names and the default namespace are the test's alone.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from jobpulse import JobState
from jobpulse._provision import RedisServer, free_port
from jobpulse.sync import StatusReader
from tests.support import ROOT

BIN = Path(sys.executable).parent
ROWS = "10"  # 0.05 s a row: half a second of work per job

QUEUES = ("arq", "saq", "taskiq", "dramatiq", "rq", "celery")


def commands(example: str) -> tuple[list[str], list[list[str]]]:
    """The docstring's one-process command and its production commands, in order (an indented
    line is a command; a trailing ``# ...`` is a comment)."""
    doc = ast.get_docstring(ast.parse((ROOT / "examples" / f"{example}_example.py").read_text()))
    assert doc is not None
    lines = [re.split(r"\s{2,}#", line)[0].strip() for line in doc.splitlines()]
    lines = [line for line, raw in zip(lines, doc.splitlines(), strict=True) if raw[:4] == "    "]
    first, *production = (shlex.split(line) for line in lines)
    return first, production


def argv(words: list[str], env: dict[str, str]) -> list[str]:
    """A documented command as this venv runs it: ``python`` is this interpreter, a console script
    is this venv's, ``$REDIS_URL`` is expanded."""
    words = [os.path.expandvars(w) if "$" in w else w for w in words]
    head = sys.executable if words[0] == "python" else str(BIN / words[0])
    return [head, *[env["REDIS_URL"] if w == "$REDIS_URL" else w for w in words[1:]]]


def run(words: list[str], env: dict[str, str], timeout: float = 90.0) -> str:
    result = subprocess.run(
        argv(words, env), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (words, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


@pytest.fixture
def own_redis() -> Iterator[dict[str, str]]:
    """The environment of a test with a Redis of its own (``REDIS_URL``)."""
    server = RedisServer().start()
    try:
        yield {**os.environ, "REDIS_URL": server.url}
    finally:
        server.close()


@pytest.mark.parametrize("example", QUEUES)
def test_the_script_runs_a_job_to_completed(example: str, own_redis: dict[str, str]) -> None:
    first, _ = commands(example)
    assert first == ["python", f"examples/{example}_example.py"]
    out = run([*first, "--rows", ROWS], own_redis)
    assert f"COMPLETED aggregate  {ROWS}/{ROWS}" in out.splitlines(), out


@pytest.mark.parametrize("example", QUEUES)
def test_the_production_commands_run_a_job_sent_from_another_process(
    example: str,
    own_redis: dict[str, str],
    session_procs: Callable[..., subprocess.Popen[bytes]],
) -> None:
    _, (worker, send, watch) = commands(example)
    assert send == ["python", f"examples/{example}_example.py", "--send"]
    assert watch[:2] == ["jobpulse", "watch"]
    session_procs(argv(worker, own_redis), own_redis)
    job_id = run([*send, "--rows", ROWS], own_redis).strip().splitlines()[-1]
    # watch waits for the job to start (the worker may still be starting), exits 0 on COMPLETED
    run([*watch[:2], job_id, "--start-timeout", "60"], own_redis, timeout=120)
    client = redis.Redis.from_url(own_redis["REDIS_URL"])
    try:
        status = StatusReader(client).get(job_id)
    finally:
        client.close()
    assert (status.state, status.done, status.total) == (JobState.COMPLETED, int(ROWS), int(ROWS))
    # the kind: the task's name (RQ names a function by its import path)
    assert status.kind == ("examples.rq_example.report" if example == "rq" else "report")


def test_the_dramatiq_page_snippets_run_as_written(own_redis: dict[str, str]) -> None:
    """docs/integrations/dramatiq.md: the install snippet, then the complete actor, sending its
    message (no worker): declared with ``store_results=True``, it needs the Results middleware
    the install snippet adds."""
    page = (ROOT / "docs" / "integrations" / "dramatiq.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[:2]
    code = "\n".join(blocks).replace("redis://localhost:6379/0", own_redis["REDIS_URL"])
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, env=own_redis, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    client = redis.Redis.from_url(own_redis["REDIS_URL"])
    try:
        assert client.hlen("dramatiq:default.msgs") == 1  # the message waits for a worker
    finally:
        client.close()


def test_the_process_pool_demo_runs_its_job_to_completed(own_redis: dict[str, str]) -> None:
    out = run(["python", "examples/process_pool_demo.py", "--items", "20"], own_redis)
    assert out.splitlines()[-1] == "final status: COMPLETED", out


def test_the_fastapi_example_answers_202_and_runs_the_job(own_redis: dict[str, str]) -> None:
    """examples/fastapi_app.py as its docstring says: POST /reports answers 202 with the status
    URL, which answers at once; the job runs to COMPLETED (``jobpulse watch`` exits 0)."""
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "examples/fastapi_app.py", "--port", str(port)],
        cwd=ROOT, env=own_redis, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ) as server:  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:  # the server is up once it answers
                try:
                    httpx.get(f"{base}/jobpulse/", timeout=2.0)
                    break
                except httpx.TransportError:
                    assert server.poll() is None, "the example exited"
                    assert time.monotonic() < deadline, "the example never answered"
                    time.sleep(0.1)
            started = httpx.post(f"{base}/reports", params={"items": 20}, timeout=30.0)
            assert started.status_code == 202, started.text
            location = started.headers["location"]
            job_id = location.rsplit("/", 1)[-1]
            assert location == f"/jobpulse/jobs/{job_id}"
            assert httpx.get(f"{base}{location}", timeout=10.0).status_code == 200
            run(["jobpulse", "watch", job_id], own_redis, timeout=120)  # exit 0: COMPLETED
        finally:
            server.terminate()
            server.wait(30)
