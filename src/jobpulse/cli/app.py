"""``jobpulse``: the command line (argparse), one function per subcommand.

Each subcommand is a thin shell over the public API; see docs/cli.md for the exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from .._protocol.keys import check_job_id, check_namespace
from .common import ExitCode, connect, exit_code_for, fail, report, resolve_url
from .render import Board, fit_line, jobs_table, status_block, status_line, to_json

if TYPE_CHECKING:
    from .. import JobStatus, StatusReader

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace, str], int]

_EPILOG = """\
connection:
  --redis URL, else $REDIS_URL, else redis://localhost:6379/0

exit codes:
  0 ok / COMPLETED   1 FAILED or the operation failed   2 Redis unreachable
  3 CANCELLED   4 LOST   5 STALE   6 UNKNOWN (no such job)   64 bad arguments   130 Ctrl-C

examples:
  jobpulse demo                       run a CPU-heavy demo job and watch it live
  jobpulse watch report-42            a live progress bar until the job ends
  jobpulse status report-42 --json    the job's status as one JSON object
  jobpulse ls --stale                 running jobs whose worker stopped beating
"""


class _Parser(argparse.ArgumentParser):
    """argparse with exit code 64 for usage errors (2 means "Redis unreachable" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _not_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _common(namespace_help: str, namespace: str | None) -> _Parser:
    """The options every command takes (``--redis``, ``--namespace``)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--redis",
        metavar="URL",
        default=None,
        help="Redis URL (default: $REDIS_URL, else redis://localhost:6379/0)",
    )
    common.add_argument("--namespace", default=namespace, help=namespace_help)
    return common


def build_parser() -> argparse.ArgumentParser:
    """The ``jobpulse`` argument parser (one subparser per command)."""
    parser = _Parser(
        prog="jobpulse",
        description="Watch, list, sweep and cancel jobpulse jobs; run the demo.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"jobpulse {__version__}")
    common = _common("the key prefix of the jobs (default: jobpulse)", "jobpulse")
    # The demo's sweeper claims every stale job of its namespace: by default a fresh one.
    demo_common = _common(
        "the key prefix of the demo's jobs (default: a fresh jobpulse-demo-XXXXXX per run; "
        "a namespace holding running jobs is refused)",
        None,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, run: Command, summary: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=[demo_common if name == "demo" else common],
            help=summary,
            description=summary,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(run=run)
        return p

    p = command(
        "status",
        cmd_status,
        "Print one job's status (exit 6 when there is no such job).",
        "jobpulse status report-42 --json",
    )
    p.add_argument("job", help="the job id")
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")

    p = command(
        "watch",
        cmd_watch,
        "Draw a live progress bar until the job ends; the exit code tells how it ended "
        "(0 COMPLETED, 1 FAILED, 3 CANCELLED, 4 LOST, 5 STALE, 6 UNKNOWN).",
        "jobpulse watch report-42 --redis redis://localhost:6379/0",
    )
    p.add_argument("job", help="the job id")
    p.add_argument("--json", action="store_true", help="print one JSON object per change, no bar")
    p.add_argument(
        "--interval", type=_positive, default=0.25, help="seconds between reads (default 0.25)"
    )
    p.add_argument(
        "--start-timeout",
        type=_positive,
        default=10.0,
        help="seconds to wait for a job that has not started yet (default 10)",
    )

    p = command(
        "ls",
        cmd_ls,
        "List the running jobs (from the running-jobs index) as a table.",
        "jobpulse ls --stale",
    )
    p.add_argument("--stale", action="store_true", help="only jobs whose worker stopped beating")
    p.add_argument("--json", action="store_true", help="print a JSON array of statuses")
    p.add_argument("--limit", type=_count, default=200, help="at most this many jobs (200)")
    _index_shards_option(p)

    p = command(
        "sweep",
        cmd_sweep,
        "Claim stale jobs (their worker died): each becomes LOST and is printed.",
        "jobpulse sweep --loop --period 2",
    )
    p.add_argument("--loop", action="store_true", help="sweep again every period until Ctrl-C")
    p.add_argument(
        "--period", type=_positive, default=1.0, help="seconds between sweeps (default 1)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per claimed job")
    _index_shards_option(p)

    p = command(
        "cancel",
        cmd_cancel,
        "Ask a running job's worker to stop (it ends CANCELLED at its next beat).",
        "jobpulse cancel report-42 --wait",
    )
    p.add_argument("job", help="the job id")
    p.add_argument("--reason", default=None, help="recorded in the job's cancel event")
    p.add_argument(
        "--wait", action="store_true", help="wait for the job to end; exit code as for watch"
    )
    p.add_argument(
        "--timeout", type=_positive, default=60.0, help="seconds --wait waits (default 60)"
    )

    from .demo import cmd_demo

    p = command(
        "demo",
        cmd_demo,
        "Run CPU-heavy jobs (hashing, a Mandelbrot kernel) in process pools under heartbeats "
        "and draw their live bars from Redis. Starts a private Redis when none answers.",
        "jobpulse demo --jobs 3 --kill",
    )
    p.add_argument("--jobs", type=_count, default=1, help="jobs side by side (default 1)")
    p.add_argument("--items", type=_count, default=600, help="work items per job (default 600)")
    p.add_argument(
        "--seconds",
        type=_not_negative,
        default=30.0,
        help="the least time each job takes: its items are paced, leaving time to run "
        "'jobpulse watch' on it from another shell (default 30; 0: as fast as the CPU goes)",
    )
    p.add_argument(
        "--kill",
        action="store_true",
        help="SIGKILL the first job's worker process midway: watch it go STALE and the "
        "sweeper claim it (LOST)",
    )

    p = command(
        "serve",
        cmd_serve,
        "Serve GET /jobs/{id}, its SSE events, the dashboard and GET /metrics over HTTP "
        '(needs "jobpulse[http]"; /metrics needs "jobpulse[prometheus]").',
        "jobpulse serve --port 8000    (beyond loopback: set JOBPULSE_TOKEN, see docs/security.md)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to bind (127.0.0.1); beyond loopback needs --token or --insecure",
    )
    p.add_argument("--port", type=int, default=8000, help="the port (8000)")
    p.add_argument(
        "--token",
        default=None,
        help="operator token that cancels and GET /metrics must carry as 'Authorization: "
        "Bearer TOKEN' (default $JOBPULSE_TOKEN; prefer the variable: arguments show in ps)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve beyond loopback without a token (anyone reaching the port may cancel jobs)",
    )
    _index_shards_option(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``jobpulse`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args = build_parser().parse_args(argv)
    url = resolve_url(args.redis)
    try:
        if args.namespace is not None:  # None: the demo picks a fresh one
            check_namespace(args.namespace)
        if getattr(args, "job", None) is not None:
            check_job_id(args.job)
        return int(args.run(args, url))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # Our output's reader left (``jobpulse ls | head``): redis-py wraps its own socket
        # errors in redis.ConnectionError, so a bare BrokenPipeError is a write of ours.
        _die_of_sigpipe()
        return ExitCode.FAILED  # where there is no SIGPIPE: quietly, as a failed write
    except Exception as exc:
        return report(exc, url)


# -- status ---------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, url: str) -> int:
    """``jobpulse status JOB [--json]``: 0, or 6 for UNKNOWN."""

    async def run() -> Any:
        async with connect(url) as client, _reader(client, args.namespace) as reader:
            return await reader.get(args.job)

    st = asyncio.run(run())
    print(to_json(st.as_dict()) if args.json else status_block(st), flush=True)
    return ExitCode.UNKNOWN if st.state.name == "UNKNOWN" else ExitCode.OK


# -- watch ----------------------------------------------------------------------------------------


def cmd_watch(args: argparse.Namespace, url: str) -> int:
    """``jobpulse watch JOB``: the exit code of the state it ended in."""
    return asyncio.run(_watch(args, url))


async def _watch(args: argparse.Namespace, url: str) -> int:
    from .. import JobState

    async with connect(url) as client, _reader(client, args.namespace) as reader:
        with Board(json=args.json) as board:
            st = await _follow(reader, board, args.job, args.interval, args.start_timeout)
    # Plain lines already end with the final status; bars get a closing line, and STALE and
    # UNKNOWN an explanation.
    if not args.json and (board.live or st.state.name in ("STALE", "UNKNOWN")):
        print(_verdict(st, board.width), flush=True)
    if st.state is JobState.RUNNING:  # cannot happen: _follow returns settled or UNKNOWN
        return ExitCode.FAILED
    return exit_code_for(st.state.name)


async def _follow(reader: Any, board: Board, job: str, interval: float, start: float) -> Any:
    """Read and show ``job`` every ``interval`` until it settles (terminal or STALE) or is gone.

    A job that is UNKNOWN at first is waited for ``start`` seconds; once seen, UNKNOWN means it
    expired. Redis faults are retried for up to 30 s of continuous failure.
    """
    from .. import Backoff

    deadline = time.monotonic() + start
    seen = waiting = False
    failing_since: float | None = None
    backoff: Any = None
    while True:
        try:
            st = await reader.get(job)
        except Exception as exc:
            from .common import is_connection_fault

            if not is_connection_fault(exc):
                raise
            now = time.monotonic()
            if failing_since is None:
                failing_since, backoff = now, iter(Backoff())
                board.say(f"Redis does not answer ({exc}); retrying", style="yellow")
            if now - failing_since > 30:
                raise
            await asyncio.sleep(next(backoff))
            continue
        if failing_since is not None:
            failing_since = None
            board.say("Redis answers again", style="green")
        if st.state.name == "UNKNOWN":
            if seen or time.monotonic() > deadline:
                return st
            if not waiting:
                waiting = True
                board.say(f"waiting for job {job} to start ...", style="dim")
        else:
            seen = True
            board.show(st)
            if st.state.is_settled:
                return st
        await asyncio.sleep(interval)


def _verdict(st: Any, width: int | None) -> str:
    """What ``watch`` prints when it stops (fitted to the terminal's ``width`` under bars)."""
    name = st.state.name
    if name == "UNKNOWN":
        text = f"{st.job_id}: UNKNOWN (no such job, or it expired)"
    elif name == "STALE":
        text = (
            f"{st.job_id}: STALE: no heartbeat for {st.heartbeat_age or 0:.1f}s from worker "
            f"{st.worker} (dead or cut off); 'jobpulse sweep' claims it"
        )
    else:
        return status_line(st) if width is None else fit_line(status_line(st), width)
    if width is None:
        return text
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


# -- ls -------------------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace, url: str) -> int:
    """``jobpulse ls [--stale] [--json]``: the running jobs as a table."""
    statuses = asyncio.run(_running(url, args.namespace, args.index_shards, args.limit))
    if args.stale:
        statuses = [st for st in statuses if st.state.name == "STALE"]
    if args.json:
        print(to_json([st.as_dict() for st in statuses]), flush=True)
    elif statuses:
        width = shutil.get_terminal_size().columns if _isatty(sys.stdout) else None
        print(jobs_table(statuses, width), flush=True)
    else:
        what = "stale" if args.stale else "running"
        print(f"no {what} jobs in namespace {args.namespace}", flush=True)
    return ExitCode.OK


async def _running(url: str, namespace: str, shards: int, limit: int) -> list[JobStatus]:
    """The statuses of the jobs in the running-jobs index that are RUNNING or STALE."""
    async with connect(url) as client, _reader(client, namespace) as reader:
        return await reader.running(index_shards=shards, limit=limit)


# -- sweep ----------------------------------------------------------------------------------------


def cmd_sweep(args: argparse.Namespace, url: str) -> int:
    """``jobpulse sweep [--loop] [--period S] [--json]``: claim stale jobs, print each."""
    return asyncio.run(_sweep(args, url))


async def _sweep(args: argparse.Namespace, url: str) -> int:
    from .. import Sweeper

    def emit(job: Any) -> None:
        if args.json:
            record = {
                "job_id": job.job_id,
                "attempt": job.attempt,
                "fence": job.fence,
                "stale_for": job.stale_for,
                "worker": job.worker,
                "stage": job.stage,
                "checkpoint": job.checkpoint,
            }
            print(to_json(record), flush=True)
        else:
            print(
                f"claimed {job.job_id}: attempt {job.attempt} of worker {job.worker or '?'} "
                f"stale for {job.stale_for:.1f}s at stage {job.stage or '-'}; now LOST "
                f"(fence {job.fence})",
                flush=True,
            )

    async with connect(url) as client:
        sweeper = Sweeper(client, namespace=args.namespace, index_shards=args.index_shards)
        if not args.loop:
            jobs = await sweeper.sweep()
            for job in jobs:
                emit(job)
                await sweeper.ack(job)  # printed: handled (``--loop``'s run() acks likewise)
            if not jobs and not args.json:
                print(f"no stale jobs in namespace {args.namespace}", flush=True)
            return ExitCode.OK
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"sweeping namespace {args.namespace} every {args.period:g}s (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        async with sweeper.run(period=args.period, on_stale=emit):
            await stop.wait()
        return ExitCode.OK


# -- cancel ---------------------------------------------------------------------------------------


def cmd_cancel(args: argparse.Namespace, url: str) -> int:
    """``jobpulse cancel JOB [--wait]``: 0 when requested (or as for watch with --wait)."""
    return asyncio.run(_cancel(args, url))


async def _cancel(args: argparse.Namespace, url: str) -> int:
    from .. import request_cancel

    async with connect(url) as client, _reader(client, args.namespace) as reader:
        if not await request_cancel(client, args.job, namespace=args.namespace, reason=args.reason):
            st = await reader.get(args.job)
            if st.state.name == "UNKNOWN":
                fail(f"no job {args.job!r} in namespace {args.namespace}", ExitCode.UNKNOWN)
            fail(f"job {args.job!r} is not running ({st.state.name}): nothing to cancel")
        print(f"cancel requested: {args.job} stops at its worker's next beat", flush=True)
        if not args.wait:
            return ExitCode.OK
        try:
            st = await reader.wait(args.job, timeout=args.timeout)
        except TimeoutError:
            fail(f"job {args.job!r} did not end within {args.timeout:g}s")
    print(status_line(st), flush=True)
    return exit_code_for(st.state.name)


# -- serve ----------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, url: str) -> int:
    """``jobpulse serve [--host H] [--port P] [--token T | --insecure]``: the HTTP adapter under
    uvicorn; 64 for a bind beyond loopback without a token (checked before anything else)."""
    import importlib.util
    import os

    token = args.token if args.token is not None else os.environ.get("JOBPULSE_TOKEN") or None

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        fail(
            f"serve needs the HTTP extra ({', '.join(missing)} missing): "
            'pip install "jobpulse[http]"'
        )
    try:
        from ..http.serve import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("jobpulse.http"):
            fail("this jobpulse build has no HTTP adapter")
        raise
    from ..http.auth import check_token, exposure_error

    try:
        check_token(token)
    except ValueError as exc:
        fail(f"invalid --token / JOBPULSE_TOKEN: {exc}", ExitCode.USAGE)
    refusal = exposure_error(args.host, token=token, insecure=args.insecure)
    if refusal is not None:
        fail(refusal, ExitCode.USAGE)

    async def check() -> None:
        async with connect(url):
            pass

    asyncio.run(check())  # one clear line if Redis is not there, before uvicorn starts
    serve(
        url, args.host, args.port, args.namespace, index_shards=args.index_shards,
        token=token, insecure=args.insecure,
    )  # fmt: skip
    return ExitCode.OK


# -- helpers --------------------------------------------------------------------------------------


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _die_of_sigpipe() -> None:
    """End as ``cat`` and ``ls`` do when their reader leaves: by SIGPIPE, silently (exit 141 in
    a shell). Python ignores SIGPIPE and would instead report the error, and print another one
    when it flushes stdout at exit: stdout is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)


def _index_shards_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index-shards", type=_count, default=1, help="index shards the workers use (1)"
    )


@contextlib.asynccontextmanager
async def _reader(client: Any, namespace: str) -> AsyncIterator[StatusReader]:
    """A StatusReader without a cache (every read is fresh), closed on exit."""
    from .. import StatusReader

    async with StatusReader(client, namespace=namespace, cache_ttl=0) as reader:
        yield reader
