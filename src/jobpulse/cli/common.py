"""What every command shares: exit codes, the connection, and the one-line errors.

The CLI is a thin adapter: it parses arguments, opens a Redis client, calls the public API
(``StatusReader``, ``Sweeper``, ``request_cancel``, ``heartbeat``) and prints. Every failure a
user can cause or meet (a bad job id, an unreachable Redis) ends as one line on stderr and a
documented exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import enum
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from .._protocol.errors import failure_of
from ..errors import InvalidJobId

__all__ = [
    "DEFAULT_URL",
    "CliError",
    "ExitCode",
    "connect",
    "exit_code_for",
    "fail",
    "redact",
    "report",
    "resolve_url",
    "unreachable_message",
]

DEFAULT_URL = "redis://localhost:6379/0"
"""Used when neither ``--redis`` nor ``REDIS_URL`` is given."""

CONNECT_TIMEOUT = 3.0
"""Seconds to wait for the first PING before calling Redis unreachable."""


class ExitCode(enum.IntEnum):
    """The exit codes of ``jobpulse`` (documented in docs/cli.md)."""

    OK = 0
    """Success; for ``watch``, the job COMPLETED."""
    FAILED = 1
    """``watch``: the job FAILED. Other commands: the operation could not be done (a job that
    already ended cannot be cancelled, Redis holds foreign data, the demo went wrong)."""
    UNREACHABLE = 2
    """Redis could not be reached (or refused the connection, e.g. a wrong password)."""
    CANCELLED = 3
    """``watch``: the job was CANCELLED."""
    LOST = 4
    """``watch``: the job's attempt was LOST (claimed by a sweeper after its worker died)."""
    STALE = 5
    """``watch``: the worker stopped beating (dead or cut off) and nobody has claimed it yet."""
    UNKNOWN = 6
    """No such job (never started, or expired after its retention)."""
    USAGE = 64
    """Bad arguments: an invalid job id, namespace, URL or option (``EX_USAGE``)."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT)."""


_STATE_CODES = {
    "COMPLETED": ExitCode.OK,
    "FAILED": ExitCode.FAILED,
    "CANCELLED": ExitCode.CANCELLED,
    "LOST": ExitCode.LOST,
    "STALE": ExitCode.STALE,
    "UNKNOWN": ExitCode.UNKNOWN,
}


def exit_code_for(state_name: str) -> ExitCode:
    """The exit code of ``watch`` for a settled state (RUNNING is not one: OK)."""
    return _STATE_CODES.get(state_name, ExitCode.OK)


class CliError(Exception):
    """A failure to report as one line on stderr and an exit code.

    Args:
        message: the line (without the ``jobpulse:`` prefix).
        code: the exit code.
    """

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Raise :class:`CliError`."""
    raise CliError(message, code)


def resolve_url(option: str | None) -> str:
    """``--redis`` if given, else ``REDIS_URL``, else :data:`DEFAULT_URL`."""
    return option or os.environ.get("REDIS_URL") or DEFAULT_URL


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe to print)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return url


def unreachable_message(url: str, reason: object) -> str:
    """The one line printed when Redis does not answer at ``url``."""
    why = " ".join(str(reason).split()).rstrip(".") or type(reason).__name__
    return (
        f"cannot reach Redis at {redact(url)} ({why}); start one with "
        "'redis-server --daemonize yes', point --redis or REDIS_URL at yours, "
        "or run 'jobpulse demo', which starts its own"
    )


def is_connection_fault(exc: BaseException) -> bool:
    """True for the errors that mean "Redis is not there" (or not usable from here): the one
    error map's ``"unavailable"`` (``_protocol/errors.failure_of``), as the HTTP app's 503."""
    return failure_of(exc) == "unavailable"


@asynccontextmanager
async def connect(url: str, *, check: bool = True) -> AsyncIterator[Any]:
    """Open a ``redis.asyncio.Redis`` for ``url``; PING it first when ``check`` is true.

    Raises:
        CliError: USAGE for a malformed URL, UNREACHABLE when the PING fails.
    """
    import redis.asyncio as aioredis

    try:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT)
    except ValueError as exc:
        fail(f"invalid Redis URL {redact(url)!r}: {exc}", ExitCode.USAGE)
    try:
        if check:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT * 2):
                    await client.ping()
            except Exception as exc:
                if is_connection_fault(exc):
                    fail(unreachable_message(url, exc), ExitCode.UNREACHABLE)
                raise
        yield client
    finally:
        await client.aclose()


def report(exc: BaseException, url: str) -> ExitCode:
    """Print the one line for an exception that ended a command; return the exit code."""
    if isinstance(exc, CliError):
        message, code = str(exc), exc.code
    elif isinstance(exc, InvalidJobId):
        message, code = str(exc), ExitCode.USAGE
    elif (kind := failure_of(exc)) == "corrupt":
        message, code = f"Redis holds data jobpulse cannot read: {exc}", ExitCode.FAILED
    elif kind == "unavailable":
        message, code = unreachable_message(url, exc), ExitCode.UNREACHABLE
    else:
        raise exc
    print(f"jobpulse: {message}", file=sys.stderr, flush=True)
    return code
