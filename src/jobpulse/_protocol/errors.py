"""Classify redis-py exceptions: the one boundary where foreign errors are interpreted."""

from __future__ import annotations

from types import TracebackType

from redis.exceptions import NoScriptError, RedisError

__all__ = ["is_noscript", "is_redis_fault"]


def is_noscript(exc: BaseException) -> bool:
    """True for NOSCRIPT (after a restart or SCRIPT FLUSH): load the script and send again."""
    return isinstance(exc, NoScriptError)


def is_redis_fault(exc: BaseException) -> bool:
    """True for a fault of Redis or the network that a retry may get past.

    Connection resets and timeouts, READONLY (a failover turned the master into a replica),
    OOM (``maxmemory`` with ``noeviction``), LOADING, our own deadline (TimeoutError), and a
    connection that redis-py closed under a command in flight (see :func:`_closed_under_us`).
    """
    return isinstance(exc, RedisError | OSError | TimeoutError) or _closed_under_us(exc)


def _closed_under_us(exc: BaseException) -> bool:
    """An ``AttributeError`` raised inside redis-py's connection code: the connection's reader
    or writer was set to None by a concurrent ``disconnect()`` while this command used it.

    redis-py's asyncio cluster client does that: after every fifth MOVED it calls its own
    ``aclose()``, which disconnects every connection of every node, also those other tasks are
    using at that moment (and ``disconnect_free_connections()`` can close a connection another
    task has just taken from the free list). Under a resharding this happens routinely, since
    redis-py sends ``ASKING`` on one pooled connection and the redirected command on another,
    so the importing node answers MOVED until the client gives up. For the command in flight it
    is a connection lost mid-command, like a reset.
    """
    if not isinstance(exc, AttributeError):
        return False
    tb: TracebackType | None = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    module = "" if last is None else str(last.tb_frame.f_globals.get("__name__", ""))
    return module in ("redis.asyncio.connection", "redis.connection")
