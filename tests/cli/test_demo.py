"""``jobpulse demo``: runs with no Redis at the URL (it starts one), shows STALE and the claim
with ``--kill``, and leaves no process behind (no redis-server, no pool worker)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from jobpulse._provision import free_port, redis_answers

from .support import JOBPULSE, ROOT, env


def run_demo(*args: str, timeout: float = 240.0) -> tuple[int, str, set[tuple[int, float]]]:
    """Run the demo to its end; return its exit code, its output and every descendant process
    seen while it ran, as ``(pid, create_time)``."""
    seen: set[tuple[int, float]] = set()
    with subprocess.Popen(
        [*JOBPULSE, "demo", *args],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        out: list[str] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True)
        reader.start()
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the demo did not finish")
            try:
                for child in me.children(recursive=True):
                    seen.add((child.pid, child.create_time()))
            except psutil.Error:
                pass
            time.sleep(0.05)
        reader.join(30)
    return proc.returncode, "".join(out), seen


def assert_all_gone(processes: set[tuple[int, float]], within: float = 30.0) -> None:
    """Every process of ``processes`` has exited (a pid reused by a new process is not ours)."""

    def alive() -> list[int]:
        left = []
        for pid, created in processes:
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        return left

    deadline = time.monotonic() + within
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
def test_demo_starts_its_own_redis_and_stops_everything() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, seen = run_demo("--redis", url, "--jobs", "2", "--items", "60", "--seconds", "1")
    assert code == 0, out
    assert f"No Redis answers at {url}" in out
    port = int(re.search(r"started redis-server on port (\d+)", out).group(1))  # type: ignore[union-attr]
    assert "Stopped the Redis this demo started" in out
    assert len(re.findall(r"demo-\w+-\d: COMPLETED 60/60", out)) == 2, out
    assert "Traceback" not in out
    assert_all_gone(seen)
    assert not redis_answers("127.0.0.1", port)
    assert len(seen) >= 3  # redis-server and two pool workers at least were observed


def test_demo_kill_shows_stale_and_the_claim(redis_url: str, ns: str) -> None:
    """The killed job goes STALE and is claimed; the sidecar job beside it holds the GIL past
    its lease and is never STALE."""
    code, out, seen = run_demo(
        "--redis",
        redis_url,
        "--namespace",
        ns,
        "--jobs",
        "2",
        "--items",
        "300",
        "--seconds",
        "4",
        "--kill",
    )
    assert code == 0, out
    assert f"Redis: {redis_url}" in out
    assert re.search(r"SIGKILL -> worker process \d+ of demo-\w+-1", out), out
    assert re.search(r"demo-\w+-1: STALE", out), out
    assert re.search(r"sweeper claimed demo-\w+-1: attempt 1 .* is LOST", out), out
    assert re.search(r"demo-\w+-1: LOST", out), out
    assert re.search(r"demo-\w+-2: COMPLETED 300/300", out), out
    # beside it, the sidecar job held the GIL longer than the lease and stayed RUNNING
    assert re.search(r"demo-\w+-2 holds the GIL now", out), out
    assert re.search(r"demo-\w+-2: never STALE while it held the GIL", out), out
    assert "Traceback" not in out
    assert "leaked" not in out  # the killed worker's shared memory was tidied
    assert_all_gone(seen)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX only")
def test_demo_without_redis_server_or_docker_names_both_ways(tmp_path: object) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [*JOBPULSE, "demo", "--redis", url],
        cwd=ROOT,
        env=env(PATH=str(tmp_path), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "redis-server" in line
    assert "Docker" in line


async def _states(redis_url: str, ns: str) -> dict[str, bytes]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{ns}:*:state")]
        return {k.decode(): await client.hget(k, "status") or b"" for k in keys}
    finally:
        await client.aclose()


def test_sigterm_stops_the_demo_and_its_jobs_end_cancelled(redis_url: str, ns: str) -> None:
    """An orchestrator's SIGTERM: the demo cancels its jobs through Redis, they write
    CANCELLED, every pool worker exits, and the demo exits with 128 + SIGTERM."""
    import signal

    with subprocess.Popen(
        [*JOBPULSE, "demo", "--redis", redis_url, "--namespace", ns, "--jobs", "2",
         "--items", "100000"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True)
        reader.start()
        seen: set[tuple[int, float]] = set()
        deadline = time.monotonic() + 60
        while list(asyncio.run(_states(redis_url, ns)).values()) != [b"RUNNING"] * 2:
            assert time.monotonic() < deadline, "the demo's jobs never ran"
            time.sleep(0.1)
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen.add((child.pid, child.create_time()))
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        reader.join(30)
    text = "".join(out)
    assert code == 128 + signal.SIGTERM, text
    assert list(asyncio.run(_states(redis_url, ns)).values()) == [b"CANCELLED"] * 2, text
    assert "Traceback" not in text
    assert_all_gone(seen)


async def _stale_job_of_another_app(url: str, job: str) -> None:
    """A job of another application in the default namespace whose worker was SIGKILLed:
    STALE, waiting for that application's sweeper."""
    import redis.asyncio as aioredis

    from jobpulse import JobState, StatusReader

    from .support import Worker

    worker = await Worker.start(url, "jobpulse", job, total=5, step=0.01, outcome="hold")
    worker.kill()
    await worker.wait()
    client = aioredis.Redis.from_url(url)
    try:
        async with StatusReader(client, cache_ttl=0) as reader:
            async with asyncio.timeout(30):
                while (await reader.get(job)).state is not JobState.STALE:
                    await asyncio.sleep(0.1)
    finally:
        await client.aclose()


async def _job_state(url: str, job: str) -> tuple[str, int]:
    import redis.asyncio as aioredis

    from jobpulse import StatusReader

    client = aioredis.Redis.from_url(url)
    try:
        async with StatusReader(client, cache_ttl=0) as reader:
            st = await reader.get(job)
            return st.state.name, st.fence or 0
    finally:
        await client.aclose()


def test_demo_kill_never_touches_another_apps_stale_job(private_redis: Any) -> None:
    """On a Redis that already answers and holds another application's STALE job in the
    default namespace, ``demo --kill`` runs and sweeps in a namespace of its own: the other job
    stays STALE (its own sweeper's to claim), and ``--namespace`` naming that namespace is
    refused before anything starts."""
    url = private_redis.url
    asyncio.run(_stale_job_of_another_app(url, "their-report"))
    before = asyncio.run(_job_state(url, "their-report"))
    assert before[0] == "STALE"

    code, out, seen = run_demo(
        "--redis", url, "--jobs", "1", "--items", "300", "--seconds", "4", "--kill"
    )
    assert code == 0, out
    assert re.search(r"sweeper claimed demo-\w+-1: attempt 1 .* is LOST", out), out
    assert asyncio.run(_job_state(url, "their-report")) == before
    assert re.search(r"--namespace jobpulse-demo-\w+", out), out  # the watch hint names it
    assert_all_gone(seen)

    refused = subprocess.run(
        [*JOBPULSE, "demo", "--redis", url, "--namespace", "jobpulse", "--kill"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 64, refused
    assert "their-report" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert asyncio.run(_job_state(url, "their-report")) == before
