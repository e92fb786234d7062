"""Every ``jobpulse`` command as a real subprocess against a real Redis: exit codes, ``--json``,
the one-line errors (bad job id, unreachable Redis) with no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from jobpulse import JobState, StatusReader, heartbeat
from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import free_port
from tests.support import eventually

from .support import JOBPULSE, ROOT, Result, Worker, cli, env

COMMANDS = ("status", "watch", "ls", "sweep", "cancel", "demo", "serve")


def assert_one_line(result: Result) -> str:
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err + result.out
    return lines[0]


@pytest.fixture
async def reader(redis: aioredis.Redis, ns: str) -> AsyncIterator[StatusReader]:
    async with StatusReader(redis, namespace=ns, cache_ttl=0) as r:
        yield r


@contextlib.asynccontextmanager
async def worker(url: str, ns: str, job: str, **kw: object) -> AsyncIterator[Worker]:
    w = await Worker.start(url, ns, job, **kw)  # type: ignore[arg-type]
    try:
        yield w
    finally:
        await w.close()


async def completed_job(redis: aioredis.Redis, ns: str, job: str, total: int = 8) -> None:
    async with heartbeat(redis, job, namespace=ns, total=total, interval=0.2, ttl=1.0) as hb:
        hb.set_stage("count")
        hb.progress.advance(total)


async def stale_job(url: str, ns: str, job: str, reader: StatusReader) -> None:
    """A RUNNING job whose worker process was SIGKILLed, once readers call it STALE."""
    w = await Worker.start(url, ns, job, total=5, step=0.01, outcome="hold")

    async def beat_written() -> bool:
        st = await reader.get(job)
        return st.stage == "counting" and st.done == 5

    await eventually(beat_written, within=30)
    await w.close()

    async def is_stale() -> bool:
        return (await reader.get(job)).state is JobState.STALE

    await eventually(is_stale, within=30)


# -- help, entry points, usage errors -------------------------------------------------------------


async def test_help_of_every_command_has_an_example() -> None:
    top = await cli("--help")
    assert top.code == 0
    assert "exit codes" in top.out
    for command in COMMANDS:
        assert command in top.out
        result = await cli(command, "--help")
        assert result.code == 0, result.err
        assert f"example:\n  jobpulse {command}" in result.out


async def test_console_script_and_module_entry_point_agree() -> None:
    script = Path(sys.executable).parent / "jobpulse"  # installed next to this interpreter
    exe = str(script) if script.exists() else (shutil.which("jobpulse") or "jobpulse")
    proc = await asyncio.create_subprocess_exec(exe, "--version", stdout=subprocess.PIPE, env=env())
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert (await cli("--version")).out == out.decode()


@pytest.mark.parametrize("bad", ["has space", "a{b}", "x" * 201])
async def test_invalid_job_id_is_one_line_and_exit_64(bad: str, redis_url: str) -> None:
    for command in ("status", "watch", "cancel"):
        result = await cli(command, bad, "--redis", redis_url)
        assert result.code == 64
        assert "invalid job id" in assert_one_line(result)


async def test_invalid_namespace_and_option_are_usage_errors(redis_url: str) -> None:
    result = await cli("ls", "--namespace", "no spaces", "--redis", redis_url)
    assert result.code == 64
    assert "invalid namespace" in assert_one_line(result)
    result = await cli("sweep", "--loop", "--period", "-1", "--redis", redis_url)
    assert result.code == 64
    assert "must be > 0" in result.err
    assert "Traceback" not in result.err


# -- unreachable Redis ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["status", "j1"], ["watch", "j1"], ["ls"], ["sweep"], ["cancel", "j1"], ["serve"]],
)
async def test_unreachable_redis_is_one_line_exit_2(argv: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = await cli(*argv, "--redis", url)
    assert result.code == 2, result
    line = assert_one_line(result)
    assert url in line
    assert "redis-server" in line
    assert "jobpulse demo" in line


async def test_redis_url_comes_from_the_environment() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    result = await cli("status", "j1", environ=env(REDIS_URL=url))
    assert result.code == 2
    line = assert_one_line(result)
    assert f"127.0.0.1:{url.rsplit(':', 1)[1]}" in line
    assert "secret" not in line  # the password is never printed


# -- status ---------------------------------------------------------------------------------------


async def test_status_json_of_a_running_job(
    redis_url: str, ns: str, redis: aioredis.Redis, reader: StatusReader
) -> None:
    async with worker(redis_url, ns, "run-1", total=10, step=0.01, outcome="hold"):
        # The worker says ready once its lease is held; its stage reaches Redis with a beat
        # after that (under load, after the CLI's read): wait for that beat first.
        async def staged() -> bool:
            return (await reader.get("run-1")).stage == "counting"

        await eventually(staged, within=30)
        result = await cli("status", "run-1", "--json", "--redis", redis_url, "--namespace", ns)
        assert result.code == 0, result.err
        data = json.loads(result.out)
        assert data["job_id"] == "run-1"
        assert data["state"] == "RUNNING"
        assert data["total"] == 10
        assert data["stage"] == "counting"
        assert data["attempt"] == 1
        for field in ("done", "percent", "rate", "eta", "rss_bytes", "cpu_seconds", "loop_lag",
                      "seq", "fence", "worker", "heartbeat_age", "progress_age", "error",
                      "meta"):  # fmt: skip
            assert field in data
        human = await cli("status", "run-1", "--redis", redis_url, "--namespace", ns)
        assert human.code == 0
        assert "RUNNING" in human.out
        assert "counting" in human.out


async def test_status_of_completed_and_unknown_jobs(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    await completed_job(redis, ns, "done-1", total=8)
    result = await cli("status", "done-1", "--json", "--redis", redis_url, "--namespace", ns)
    assert result.code == 0
    data = json.loads(result.out)
    assert (data["state"], data["done"], data["total"], data["percent"]) == (
        "COMPLETED", 8, 8, 100.0
    )  # fmt: skip
    result = await cli("status", "nobody", "--json", "--redis", redis_url, "--namespace", ns)
    assert result.code == 6
    assert json.loads(result.out)["state"] == "UNKNOWN"


# -- watch (not a terminal: one line per change) --------------------------------------------------


async def test_watch_exit_codes_per_final_state(
    redis_url: str, ns: str, redis: aioredis.Redis, reader: StatusReader
) -> None:
    base = ("--redis", redis_url, "--namespace", ns)
    # COMPLETED: the watcher starts before the job and follows it to the end.
    watch = asyncio.ensure_future(cli("watch", "w-ok", *base, "--start-timeout", "60"))
    async with worker(redis_url, ns, "w-ok", total=20, step=0.05) as w:
        assert await w.wait() == 0
    result = await watch
    assert result.code == 0, result
    last = result.out.splitlines()[-1].split()
    assert last[:2] == ["w-ok", "COMPLETED"]
    assert "20/20" in last
    # FAILED
    async with worker(redis_url, ns, "w-fail", total=3, step=0.01, outcome="fail") as w:
        await w.wait()
    result = await cli("watch", "w-fail", *base)
    assert result.code == 1
    assert "RuntimeError: boom" in result.out
    # STALE, then LOST once swept
    await stale_job(redis_url, ns, "w-dead", reader)
    result = await cli("watch", "w-dead", *base)
    assert result.code == 5
    assert "STALE" in result.out
    swept = await cli_sweep_until(base, "w-dead")
    assert swept["attempt"] == 1
    result = await cli("watch", "w-dead", *base)
    assert result.code == 4
    assert "LOST" in result.out
    # UNKNOWN: nothing starts within --start-timeout
    result = await cli("watch", "never", *base, "--start-timeout", "0.5")
    assert result.code == 6
    assert "UNKNOWN" in result.out


async def test_watch_json_prints_one_object_per_change(redis_url: str, ns: str) -> None:
    base = ("--redis", redis_url, "--namespace", ns)
    watch = asyncio.ensure_future(cli("watch", "w-json", *base, "--json", "--start-timeout", "60"))
    async with worker(redis_url, ns, "w-json", total=30, step=0.05) as w:
        await w.wait()
    result = await watch
    assert result.code == 0
    objects = [json.loads(line) for line in result.out.splitlines()]
    assert objects[-1]["state"] == "COMPLETED"
    assert objects[-1]["done"] == 30
    done = [o["done"] for o in objects]
    assert done == sorted(done)


# -- ls, sweep ------------------------------------------------------------------------------------


async def cli_sweep_until(base: tuple[str, ...], job: str) -> dict[str, object]:
    """Run ``jobpulse sweep --json`` until it claims ``job`` (the index deadline of a dead worker
    passes a few seconds after its lease); return the claim."""

    async def claimed() -> dict[str, object] | None:
        result = await cli("sweep", "--json", *base)
        assert result.code == 0, result.err
        for line in result.out.splitlines():
            record = json.loads(line)
            if record["job_id"] == job:
                return dict(record)
        return None

    return await eventually(claimed, within=60, step=0.3)


async def test_ls_lists_running_and_stale_jobs(
    redis_url: str, ns: str, reader: StatusReader
) -> None:
    base = ("--redis", redis_url, "--namespace", ns)
    empty = await cli("ls", *base)
    assert empty.code == 0
    assert "no running jobs" in empty.out
    async with worker(redis_url, ns, "ls-live", total=5, step=0.01, outcome="hold"):
        await stale_job(redis_url, ns, "ls-dead", reader)
        result = await cli("ls", "--json", *base)
        assert result.code == 0
        states = {s["job_id"]: s["state"] for s in json.loads(result.out)}
        assert states == {"ls-live": "RUNNING", "ls-dead": "STALE"}
        result = await cli("ls", "--stale", "--json", *base)
        assert [s["job_id"] for s in json.loads(result.out)] == ["ls-dead"]
        table = await cli("ls", *base)
        assert table.out.splitlines()[0].split()[:3] == ["JOB", "STATE", "STAGE"]
        rows = table_rows(table.out)
        assert rows["ls-live"]["STATE"] == "RUNNING"
        assert rows["ls-live"]["STILL"].endswith("s")  # done stood still since it reached 5
        # a STALE row keeps no ETA nor rate of the worker that stopped, nor a standstill age
        assert rows["ls-dead"]["STATE"] == "STALE"
        assert (rows["ls-dead"]["ETA"], rows["ls-dead"]["RATE"]) == ("-", "-")
        assert rows["ls-dead"]["STILL"] == "-"


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """``ls``'s plain table as ``{job: {column: cell}}`` (cells sliced at the header's columns:
    a cell may hold a space)."""
    header, *lines = text.splitlines()
    names = header.split()
    starts = [header.index(f"{n} ") if n != names[-1] else header.rindex(n) for n in names]
    bounds = [*starts[1:], None]
    rows = [{n: line[a:b].strip() for n, a, b in zip(names, starts, bounds, strict=True)}
            for line in lines]  # fmt: skip
    return {row["JOB"]: row for row in rows}


async def test_ls_into_a_closed_pipe_exits_quietly(redis_url: str, ns: str) -> None:
    """``jobpulse ls | head``: the reader of stdout left before ls wrote. Like ``cat``, ls ends
    by SIGPIPE with nothing on stderr (it said "cannot reach Redis ... Broken pipe", exit 2)."""
    base = ("--redis", redis_url, "--namespace", ns)
    async with worker(redis_url, ns, "pipe-live", total=5, step=0.01, outcome="hold"):
        read, write = os.pipe()
        os.close(read)  # nobody will read: the first write fails with EPIPE
        try:
            proc = subprocess.run(
                [*JOBPULSE, "ls", *base], stdout=write, stderr=subprocess.PIPE, cwd=ROOT,
                env=env(), timeout=60, check=False,
            )  # fmt: skip
        finally:
            os.close(write)
    assert proc.stderr.decode() == ""
    assert proc.returncode == -signal.SIGPIPE


async def test_sweep_once_claims_a_dead_workers_job(
    redis_url: str, ns: str, reader: StatusReader
) -> None:
    base = ("--redis", redis_url, "--namespace", ns)
    nothing = await cli("sweep", *base)
    assert (nothing.code, nothing.out.strip()) == (0, f"no stale jobs in namespace {ns}")
    await stale_job(redis_url, ns, "sw-dead", reader)
    claim = await cli_sweep_until(base, "sw-dead")
    assert claim["stage"] == "counting"
    assert (await reader.get("sw-dead")).state is JobState.LOST
    raw = aioredis.Redis.from_url(redis_url)
    try:  # printed, hence acknowledged: no later sweep hands the claim out again
        assert await raw.hget(KeySchema(ns).state("sw-dead"), "claim") is None
    finally:
        await raw.aclose()


async def test_sweep_loop_claims_and_stops_on_sigint(
    redis_url: str, ns: str, reader: StatusReader
) -> None:
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE, "sweep", "--loop", "--period", "0.2", "--json",
        "--redis", redis_url, "--namespace", ns,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            assert b"sweeping namespace" in await proc.stderr.readline()
        await stale_job(redis_url, ns, "loop-dead", reader)
        async with asyncio.timeout(60):
            record = json.loads(await proc.stdout.readline())
        assert record["job_id"] == "loop-dead"
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- cancel ---------------------------------------------------------------------------------------


async def test_cancel_running_ended_and_unknown_jobs(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    base = ("--redis", redis_url, "--namespace", ns)
    async with worker(redis_url, ns, "c-run", total=5, step=0.01, outcome="hold") as w:
        result = await cli("cancel", "c-run", "--wait", "--reason", "test", *base)
        assert result.code == 3, result
        assert "cancel requested" in result.out
        assert "CANCELLED" in result.out
        await w.wait()
    async with worker(redis_url, ns, "c-run2", total=5, step=0.01, outcome="hold") as w:
        result = await cli("cancel", "c-run2", *base)
        assert result.code == 0
        await w.wait()
    status = json.loads((await cli("status", "c-run2", "--json", *base)).out)
    assert status["state"] == "CANCELLED"
    await completed_job(redis, ns, "c-done")
    result = await cli("cancel", "c-done", *base)
    assert result.code == 1
    assert "COMPLETED" in assert_one_line(result)
    result = await cli("cancel", "c-nobody", *base)
    assert result.code == 6
    assert "no job" in assert_one_line(result)


# -- serve ----------------------------------------------------------------------------------------


async def test_serve_answers_http_and_stops_on_sigint(
    redis_url: str, ns: str, redis: aioredis.Redis
) -> None:
    await completed_job(redis, ns, "http-1", total=4)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *JOBPULSE, "serve", "--port", str(port), "--redis", redis_url, "--namespace", ns,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def answer() -> httpx.Response | None:
                with contextlib.suppress(httpx.TransportError):
                    return await http.get("/jobs/http-1")
                return None

            response = await eventually(answer, within=60, step=0.1)
            assert response.status_code == 200
            assert response.json()["state"] == "COMPLETED"
            assert (await http.get("/jobs/http-none")).status_code == 404
            metrics = await http.get("/metrics")  # jobpulse serve exposes /metrics
            assert metrics.status_code == 200
            assert "jobpulse_index_entries" in metrics.text
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX only")
async def test_serve_without_the_http_extra_prints_the_pip_hint(tmp_path: object) -> None:
    # A sitecustomize that hides starlette, as if the extra were not installed.
    site = Path(str(tmp_path))
    (site / "sitecustomize.py").write_text(
        "import sys\nsys.modules['starlette'] = None\n"  # import starlette -> ImportError
        "import importlib.util as u\n_f = u.find_spec\n"
        "u.find_spec = lambda n, *a: None if n == 'starlette' else _f(n, *a)\n"
    )
    result = await cli("serve", environ=env(PYTHONPATH=str(site)))
    assert result.code == 1
    assert 'pip install "jobpulse[http]"' in assert_one_line(result)
