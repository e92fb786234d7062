"""Classify redis-py exceptions: the one boundary where foreign errors are interpreted."""

from __future__ import annotations

from redis.exceptions import NoScriptError, RedisError

__all__ = ["is_noscript", "is_redis_fault"]


def is_noscript(exc: BaseException) -> bool:
    """True for NOSCRIPT (after a restart or SCRIPT FLUSH): load the script and send again."""
    return isinstance(exc, NoScriptError)


def is_redis_fault(exc: BaseException) -> bool:
    """True for a fault of Redis or the network that a retry may get past.

    Connection resets and timeouts, READONLY (a failover turned the master into a replica),
    OOM (``maxmemory`` with ``noeviction``), LOADING, and our own deadline (TimeoutError).
    """
    return isinstance(exc, RedisError | OSError | TimeoutError)
