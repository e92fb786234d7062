"""``jobpulse demo``: real CPU-heavy jobs under heartbeats, drawn live from what Redis says.

Each job runs in a process of its own (a one-worker ``ProcessPoolExecutor``, spawn): there,
``heartbeat(...)`` holds the job's lease while the computation — SHA-256 over 64 KiB blocks, then
a pure-Python Mandelbrot kernel — advances the job's ``ProgressCell`` from an executor thread.
This process only *reads*: a ``StatusReader`` polls every job's snapshot and the bars show
exactly what any other client of Redis would see.

SIGTERM (an orchestrator stopping the demo) is handled like Ctrl-C: the running jobs are asked
to stop through Redis and end CANCELLED, then the demo exits with 143. A SIGTERM that reaches a
pool worker (its whole process group stopped) cancels that worker's job the same way.

The last job (of two or more) runs with ``sidecar=True`` and, between its two kernels, holds the
GIL and its event loop in one C call for ``GIL_HOLD`` seconds (longer than the lease): its beats
come from the sidecar helper process, so it stays RUNNING throughout (with in-loop beats it would
turn STALE and lose its lease).

``--kill`` SIGKILLs the first job's worker process midway. Its heartbeat dies with it, so the
liveness key expires within the lease and the verdict turns STALE; a ``Sweeper`` then claims the
job (LOST, fence bumped) — the demo shows both. A pool per job keeps the kill to that job: a
process pool whose worker dies is broken as a whole.

Redis: the URL's server when it answers, else a private ``redis-server`` from PATH, else a
Docker container (``jobpulse._provision``); whatever the demo starts, it stops.

The demo touches its own namespace only: its sweeper claims *every* stale job of the namespace
it sweeps, so by default the demo runs in a fresh ``jobpulse-demo-XXXXXX``, and a namespace
given with ``--namespace`` is refused when its running index already names a job (another
application's, which the demo's sweeper could turn LOST).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import multiprocessing
import os
import secrets
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from .common import ExitCode, connect, fail, redact
from .render import Board, live_summary

__all__ = ["TERMINATED", "cmd_demo", "hash_kernel", "mandelbrot_kernel", "run_job"]

TERMINATED = 128 + signal.SIGTERM
"""Exit code of a demo stopped by SIGTERM (its jobs were cancelled and ended CANCELLED)."""

INTERVAL = 0.5
"""Heartbeat interval of the demo jobs (seconds)."""
TTL = 2.0
"""Lease / liveness TTL of the demo jobs: a killed worker is STALE this long after its last beat."""
TICK = 0.2
"""Seconds between two reads of every job's snapshot."""
KILL_AT = 30.0
"""``--kill`` strikes once the first job has done this many percent."""
LIMIT = 900.0
"""Seconds after which the demo gives up (something is badly wrong)."""

GIL_HOLD = 2 * TTL
"""Seconds the sidecar job holds the GIL in one C call (a lease and more)."""

_BLOCK = bytes(range(256)) * 256  # 64 KiB


# -- the work (runs in the pool process) ----------------------------------------------------------


def _pace(started: float, done: int, per_item: float) -> None:
    """Sleep until ``done`` items have taken at least ``per_item`` seconds each."""
    ahead = started + done * per_item - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)


def hash_kernel(cell: Any, items: int, blocks: int = 96, per_item: float = 0.0) -> str:
    """SHA-256 chained over ``blocks`` 64 KiB blocks per item (hashlib releases the GIL); each
    item takes at least ``per_item`` seconds."""
    digest = b"jobpulse"
    started = time.monotonic()
    for n in range(items):
        cell.check()  # raises JobCancelled once the job must stop
        h = hashlib.sha256(digest)
        for _ in range(blocks):
            h.update(_BLOCK)
        digest = h.digest()
        cell.advance()
        _pace(started, n + 1, per_item)
    return digest.hex()


def mandelbrot_kernel(
    cell: Any, items: int, width: int = 240, depth: int = 120, per_item: float = 0.0
) -> int:
    """Count the points of one Mandelbrot row per item that stay bounded (pure Python); each
    item takes at least ``per_item`` seconds."""
    inside = 0
    started = time.monotonic()
    for row in range(items):
        _pace(started, row, per_item)
        cell.check()
        ci = -1.2 + 2.4 * (row % 200) / 200
        for x in range(width):
            c = complex(-2.1 + 3.0 * x / width, ci)
            z = 0j
            for _ in range(depth):
                z = z * z + c
                if z.real * z.real + z.imag * z.imag > 4.0:
                    break
            else:
                inside += 1
        cell.advance()
    return inside


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the demo, which cancels their jobs through Redis."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_job(
    url: str, namespace: str, job_id: str, items: int, seconds: float = 0.0, gil: bool = False
) -> str:
    """One demo job, start to end, in the calling process (a pool worker); it takes at least
    ``seconds`` (its items are paced), so there is time to watch it from another shell.
    ``gil``: beaten by the sidecar, it holds the GIL for ``GIL_HOLD`` seconds between its
    kernels."""
    return asyncio.run(_job(url, namespace, job_id, items, seconds, gil))


def hold_gil(seconds: float) -> int:
    """Hold the GIL for about ``seconds`` in ONE C call (``sum(range(n))``, n calibrated)."""
    n = 1_000_000
    while True:
        started = time.perf_counter()
        sum(range(n))
        took = time.perf_counter() - started
        if took > 0.05:
            break
        n *= 4
    return sum(range(int(n * seconds / took)))


async def _job(url: str, namespace: str, job_id: str, items: int, seconds: float, gil: bool) -> str:
    import redis.asyncio as aioredis

    from .. import heartbeat

    client = aioredis.Redis.from_url(url)
    # SIGTERM (the process group stopped): cancel the job, so its exit writes CANCELLED.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        async with heartbeat(
            client,
            job_id,
            namespace=namespace,
            total=items,
            interval=INTERVAL,
            ttl=TTL,
            meta={"demo": True, "kernels": ["sha256", "mandelbrot"]},
            sidecar=gil,
        ) as hb:
            loop = asyncio.get_running_loop()
            half, per_item = items // 2, seconds / items
            hb.set_stage("sha256")
            digest = await loop.run_in_executor(None, hash_kernel, hb.progress, half, 96, per_item)
            await hb.checkpoint(stage="sha256", digest=digest[:16])
            if gil:
                hb.set_stage("gil-hold")  # a message: the helper's next beat carries it
                hold_gil(GIL_HOLD)  # GIL and event loop held: only the helper can beat
            hb.set_stage("mandelbrot")
            inside = await loop.run_in_executor(
                None, mandelbrot_kernel, hb.progress, items - half, 240, 120, per_item
            )
            return f"sha256 {digest[:12]}, {inside} Mandelbrot points"
    finally:
        await client.aclose()


# -- the command ----------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, url: str) -> int:
    """``jobpulse demo [--jobs N] [--items N] [--seconds S] [--kill]``: 0 when every job ended
    as expected."""
    from .._provision import provision_redis

    board = Board()
    with contextlib.ExitStack() as stack:
        try:
            real_url, how = stack.enter_context(provision_redis(url))
        except RuntimeError as exc:
            fail(f"no Redis answers at {redact(url)}, and {exc}", ExitCode.UNREACHABLE)
        tag = secrets.token_hex(3)
        ns = args.namespace if args.namespace is not None else f"jobpulse-demo-{tag}"
        if how == "given":
            board.say(f"Redis: {redact(real_url)}")
            if args.namespace is not None:
                foreign = asyncio.run(_running_ids(real_url, ns))
                if foreign:
                    fail(
                        f"namespace {ns!r} already holds running or stale jobs ({foreign[0]}, "
                        "...): the demo's sweeper would claim them; omit --namespace (the demo "
                        "then uses a fresh one) or name an unused namespace",
                        ExitCode.USAGE,
                    )
        else:
            board.say(
                f"No Redis answers at {redact(url)}: {how} for this demo at {real_url} "
                "(stopped when the demo ends)"
            )
            stack.callback(board.say, f"Stopped the Redis this demo started ({how}).")
        demo = _demo(
            real_url,
            ns,
            tag,
            args.jobs,
            args.items,
            args.seconds,
            args.kill,
            board,
            own_redis=how != "given",
        )
        try:
            return asyncio.run(demo)
        except asyncio.CancelledError:  # SIGTERM: the jobs were cancelled (see _demo)
            board.say("Stopped by SIGTERM: the running jobs were cancelled.")
            return TERMINATED
    raise AssertionError("unreachable")  # pragma: no cover - for type checkers


async def _running_ids(url: str, ns: str) -> list[str]:
    """The jobs the running index of ``ns`` names (RUNNING or STALE, whoever started them)."""
    from .. import StatusReader

    async with connect(url) as client, StatusReader(client, namespace=ns) as reader:
        ids, _ = await reader.running_ids(limit=1)
        return ids


async def _demo(
    url: str,
    ns: str,
    tag: str,
    jobs: int,
    items: int,
    seconds: float,
    kill: bool,
    board: Board,
    *,
    own_redis: bool,
) -> int:
    ids = [f"demo-{tag}-{i}" for i in range(1, jobs + 1)]
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    pools = [ProcessPoolExecutor(1, mp_context=spawn, initializer=_ignore_sigint) for _ in ids]
    runs: dict[str, asyncio.Future[str]] = {}
    pids: list[int] = []
    killed = _Killed()
    # SIGTERM: cancel this task; the interrupted path below cancels the jobs through Redis.
    main = asyncio.current_task()
    assert main is not None
    terminated = asyncio.Event()

    def on_sigterm() -> None:
        terminated.set()
        main.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        # Start each pool's process first and learn its pid: --kill strikes exactly there.
        pids += await asyncio.gather(*(loop.run_in_executor(p, os.getpid) for p in pools))
        board.say(
            f"{jobs} job(s) of {items} items (SHA-256, then a Mandelbrot kernel; "
            f"at least {seconds:g}s each), one worker "
            f"process each (pid {', '.join(map(str, pids))}); heartbeat every {INTERVAL:g}s, "
            f"lease {TTL:g}s. From another shell: jobpulse watch {ids[0]} --redis {url}"
            + f" --namespace {ns}"
        )
        async with connect(url) as client:
            gil_job = ids[-1] if len(ids) > 1 else None
            if gil_job is not None:
                board.say(
                    f"{gil_job} runs with sidecar=True: its beats come from a helper process, "
                    f"and midway it holds the GIL in one C call for {GIL_HOLD:g}s (longer than "
                    "the lease)"
                )
            runs = {
                job: loop.run_in_executor(
                    pool, run_job, url, ns, job, items, seconds, job == gil_job
                )
                for job, pool in zip(ids, pools, strict=True)
            }
            try:
                victim = pids[0] if kill else None
                code = await _drive(client, ns, ids, runs, victim, board, killed, gil_job)
            except BaseException:
                # Ctrl-C reached a private redis-server too (same terminal); SIGTERM did not.
                cancel = terminated.is_set() or not own_redis
                await _stop(client, ns, runs, pids, killed, cancel=cancel)
                raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        killed.forget_blocks()
    return code


async def _drive(
    client: Any,
    ns: str,
    ids: list[str],
    runs: dict[str, asyncio.Future[str]],
    victim_pid: int | None,
    board: Board,
    killed: _Killed,
    gil_job: str | None = None,
) -> int:
    """Draw every job until all have ended (and the victim has been claimed); return the code."""
    from .. import JobState, StaleJob, StatusReader, Sweeper

    victim = ids[0] if victim_pid is not None else None
    killed_at: float | None = None
    stale_seen = claim_seen = gil_stale = False
    gil_held: float | None = None
    claims: dict[str, StaleJob] = {}
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        reader = await stack.enter_async_context(StatusReader(client, namespace=ns, cache_ttl=0))
        stack.enter_context(board)
        sweeping = False
        while True:
            statuses = {st.job_id: st for st in await asyncio.gather(*map(reader.get, ids))}
            for st in statuses.values():
                if st.state is not JobState.UNKNOWN:
                    board.show(st)
            now = time.monotonic()
            if gil_job is not None:
                st = statuses[gil_job]
                if st.stage == "gil-hold" and gil_held is None:
                    gil_held = now
                    board.say(
                        f"{gil_job} holds the GIL now (one C call, {GIL_HOLD:g}s): its sidecar "
                        f"helper beats on, so it stays RUNNING past the {TTL:g}s lease",
                        style="bold green",
                    )
                if st.state is JobState.STALE and not gil_stale:
                    gil_stale = True
                    board.say(f"{gil_job} was read STALE while holding the GIL", style="red")
            if victim is not None:
                st = statuses[victim]
                if killed_at is None and st.state is JobState.RUNNING:
                    if (st.percent or 0) >= KILL_AT:
                        assert victim_pid is not None
                        killed.kill(victim_pid)
                        killed_at = now
                        board.say(
                            f"SIGKILL -> worker process {victim_pid} of {victim} at "
                            f"{st.percent:.0f}%: its heartbeat dies with it; the verdict turns "
                            f"STALE when the {TTL:g}s lease runs out",
                            style="bold red",
                        )
                elif killed_at is None and runs[victim].done():
                    board.say(f"{victim} ended before it could be killed (too few --items)")
                    victim = None
                if st.state is JobState.STALE and not stale_seen:
                    stale_seen = True
                    board.say(
                        f"{victim}: STALE {now - (killed_at or now):.1f}s after the kill: "
                        "the snapshot still says RUNNING but the liveness key is gone. "
                        "Starting the sweeper.",
                        style="bold red",
                    )
            if not sweeping and (victim is None or stale_seen):
                sweeper = Sweeper(client, namespace=ns)
                await stack.enter_async_context(
                    sweeper.run(period=0.5, on_stale=lambda job: claims.setdefault(job.job_id, job))
                )
                sweeping = True
            if victim is not None and victim in claims and not claim_seen:
                claim_seen = True
                job = claims[victim]
                board.say(
                    f"sweeper claimed {victim}: attempt {job.attempt} (worker {job.worker}, "
                    f"stage {job.stage or '-'}) is LOST, fence now {job.fence}, stale for "
                    f"{job.stale_for:.1f}s; heartbeat() on it again would run attempt "
                    f"{job.attempt + 1} from its last checkpoint",
                    style="bold magenta",
                )
            others_done = all(
                runs[j].done() and statuses[j].state.is_terminal for j in ids if j != victim
            )
            victim_done = victim is None or (claim_seen and statuses[victim].state.is_terminal)
            if others_done and victim_done:
                break
            if now - started > LIMIT:
                board.say(f"the demo did not finish within {LIMIT:g}s; stopping", style="red")
                raise TimeoutError("demo did not finish")
            await asyncio.sleep(0.2)
    if gil_held is not None and not gil_stale:
        board.say(f"{gil_job}: never STALE while it held the GIL", style="bold green")
    code = _summary(ids, statuses, runs, victim, board)
    return ExitCode.FAILED if gil_stale else code


def _summary(
    ids: list[str], statuses: dict[str, Any], runs: dict[str, Any], victim: str | None, b: Board
) -> int:
    """Print one line per job; 0 when the victim is LOST and every other job COMPLETED."""
    ok = True
    lines = []
    for job in ids:
        st, error = statuses[job], runs[job].exception()  # retrieved: no "never retrieved" noise
        line = live_summary([st])
        if job == victim:
            ok &= st.state.name == "LOST"
        elif error is not None:
            ok = False
            line += f": {type(error).__name__}: {error}"
        else:
            ok &= st.state.name == "COMPLETED"
            line += f": {runs[job].result()}"
        lines.append(line)
    b.say("Result:\n" + "\n".join(lines))
    return ExitCode.OK if ok else ExitCode.FAILED


async def _stop(
    client: Any, ns: str, runs: dict[str, Any], pids: list[int], killed: _Killed, *, cancel: bool
) -> None:
    """Interrupted: ask the running jobs to stop through Redis (when ``cancel``), give them 5 s,
    then kill their workers. A private redis-server got the terminal's Ctrl-C too, so with one
    the workers are killed at once; the throwaway server goes with their snapshots."""
    from .. import request_cancel

    pending = [job for job, run in runs.items() if not run.done()]
    if cancel and pending:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                for job in pending:
                    await request_cancel(client, job, namespace=ns, reason="demo interrupted")
            await asyncio.wait([runs[job] for job in pending], timeout=5.0)
    for job, pid in zip(runs, pids, strict=False):
        if not runs[job].done():
            killed.kill(pid)
    for run in runs.values():  # collected, so asyncio does not report them as never retrieved
        run.add_done_callback(lambda f: f.cancelled() or f.exception())


class _Killed:
    """The pool workers this demo SIGKILLed and the shared-memory blocks they had made.

    A killed worker's blocks stay registered with the resource tracker this process shares with
    the workers it spawned, which would warn of a leak at exit. The names are taken while the
    worker still lives (the arena's leftover sweep, in any other jobpulse process, removes a
    dead creator's blocks: a look after the kill could find them gone and leave them
    registered), then unregistered and removed at the end. Blocks of any other process are
    never touched.
    """

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.blocks: set[str] = set()

    def _look(self, pid: int) -> None:
        from .._worker.progress import NAME_PREFIX

        self.blocks.update(p.name for p in Path("/dev/shm").glob(f"{NAME_PREFIX}{pid}_*"))

    def kill(self, pid: int) -> None:
        self._look(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.pids.append(pid)

    def forget_blocks(self) -> None:
        for pid in self.pids:
            self._look(pid)  # a block made between the first look and the kill
        for name in sorted(self.blocks):
            with contextlib.suppress(Exception):
                resource_tracker.unregister(f"/{name}", "shared_memory")
            with contextlib.suppress(FileNotFoundError):
                (Path("/dev/shm") / name).unlink()
