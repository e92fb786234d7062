"""Classify Redis errors: the one boundary where foreign errors are interpreted.

A server's error reply opens with an error code (``WRONGTYPE Operation against a key…``,
``READONLY You can't write against a read only replica``); the text after it is for humans and
differs between servers and versions (Valkey 8 and 9 reworded several: ``NOSCRIPT No matching
script.``, ``Unknown command called from script``, "Valkey is busy running a script"…). So
jobpulse decides on the code alone, here, and nowhere else matches an error's text.

redis-py strips the code of the replies it maps to a class of its own (``NOSCRIPT`` →
``NoScriptError``, ``READONLY`` → ``ReadOnlyError``, ``ERR`` → a plain ``ResponseError`` whose
text lost its ``ERR``…) and keeps it for the others (``WRONGTYPE``, ``BUSY``…):
:func:`error_code` undoes that. ``ERR`` is the one code that says nothing by itself; the two
``ERR`` replies jobpulse must tell apart (a missing key, an unknown command) are matched on the
few words both Redis and Valkey send, in this module only (tests/integration/test_server_errors.py
produces every one of them on real Redis and Valkey servers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Literal

from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ExecAbortError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from ..errors import ProtocolError

__all__ = [
    "Failure",
    "error_code",
    "failure_of",
    "is_no_such_key",
    "is_noscript",
    "is_redirect",
    "is_redis_fault",
    "is_transient",
    "is_unknown_command",
    "is_wrongtype",
    "refuses_blocking",
    "refuses_time",
    "tolerate_faults",
]

# The classes redis-py maps a code to (and strips the code from the text). Order matters:
# MovedError derives from AskError, MasterDownError from ClusterDownError.
_CLASS_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (NoScriptError, "NOSCRIPT"),
    (ReadOnlyError, "READONLY"),
    (OutOfMemoryError, "OOM"),
    (BusyLoadingError, "LOADING"),
    (NoPermissionError, "NOPERM"),
    (MovedError, "MOVED"),
    (AskError, "ASK"),
    (TryAgainError, "TRYAGAIN"),
    (MasterDownError, "MASTERDOWN"),
    (ClusterDownError, "CLUSTERDOWN"),
    (ClusterCrossSlotError, "CROSSSLOT"),
    (ExecAbortError, "EXECABORT"),
)

# Codes redis-py leaves in the text (a plain ResponseError whose first word is the code).
# Anything else in a plain ResponseError had its ``ERR`` stripped: its first word is prose,
# sometimes in capitals (``EXEC without MULTI``), so an unknown capital word is not a code.
_TEXT_CODES = frozenset(
    {
        "WRONGTYPE", "BUSY", "BUSYKEY", "BUSYGROUP", "NOGROUP", "NOREPLICAS", "MISCONF",
        "UNKILLABLE", "NOTBUSY", "NOPROTO", "UNBLOCKED", "NOTREADY", "NOAUTH", "WRONGPASS",
        "READONLY", "OOM", "LOADING", "NOSCRIPT", "NOPERM", "MOVED", "ASK", "TRYAGAIN",
        "CLUSTERDOWN", "CROSSSLOT", "MASTERDOWN", "EXECABORT",
    }
)  # fmt: skip

# Replies a retry (or a failover, or a slot map refresh) may get past.
_TRANSIENT = frozenset(
    {"READONLY", "OOM", "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED",
     "ASK", "NOREPLICAS", "MISCONF", "UNBLOCKED"}
)  # fmt: skip


def error_code(exc: BaseException) -> str | None:
    """The server's error code of an error reply (``"WRONGTYPE"``, ``"READONLY"``, ``"ERR"``…),
    or None when ``exc`` is not an error reply (a connection fault, a timeout, a bug).

    Args:
        exc: an exception raised by redis-py, or an error reply returned in a pipeline's results.
    """
    for cls, code in _CLASS_CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, AuthenticationError):  # NOAUTH and WRONGPASS: one class in redis-py
        return "NOAUTH"
    if not isinstance(exc, ResponseError):
        return None
    first = str(exc).split(" ", 1)[0]
    return first if first in _TEXT_CODES else "ERR"


def _text(exc: BaseException) -> str:
    return str(exc).lower()


def is_wrongtype(exc: BaseException) -> bool:
    """True for WRONGTYPE: a key holds another type (a foreign key in our namespace); a retry
    cannot get past it."""
    return error_code(exc) == "WRONGTYPE"


def is_noscript(exc: BaseException) -> bool:
    """True for NOSCRIPT (after a restart or SCRIPT FLUSH): load the script and send again."""
    return error_code(exc) == "NOSCRIPT"


def is_no_such_key(exc: BaseException) -> bool:
    """True for the ``ERR no such key`` of commands that need the key to exist (``XINFO
    STREAM``, ``RENAME``): Redis 6.2 to 8 and Valkey 8 and 9 send these words."""
    return error_code(exc) == "ERR" and "no such key" in _text(exc)


def is_unknown_command(exc: BaseException) -> bool:
    """True when the server does not know (or has renamed away) a command, called directly
    (``ERR unknown command 'X'``) or from a script (Redis: ``Unknown Redis command called from
    script``; Valkey: ``Unknown command called from script``)."""
    if error_code(exc) != "ERR":
        return False
    text = _text(exc)
    return text.startswith("unknown command") or text.startswith("unknown redis command")


def is_redirect(exc: BaseException) -> bool:
    """True for MOVED and ASK: a cluster slot lives (or is moving) elsewhere."""
    return error_code(exc) in ("MOVED", "ASK")


def is_transient(exc: BaseException) -> bool:
    """True for an error reply that a retry may get past: READONLY (a failover turned the master
    into a replica), OOM (``maxmemory`` with ``noeviction``), LOADING, BUSY (a long script),
    MASTERDOWN, TRYAGAIN, CLUSTERDOWN, MOVED and ASK, NOREPLICAS, MISCONF."""
    return error_code(exc) in _TRANSIENT


def refuses_time(exc: BaseException) -> bool:
    """True when a script call failed because the server refuses ``TIME`` in scripts: renamed
    away or unknown (``Unknown Redis command called from script``), or refused by an ACL or a
    managed server's rule (``NOPERM``, or an ``ERR`` naming TIME and scripts). The script
    clock (``clock.py``) then stamps the time as an argument."""
    if is_unknown_command(exc) and "script" in _text(exc):
        return True
    text = _text(exc)
    return error_code(exc) in ("ERR", "NOPERM") and "time" in text and "script" in text


def refuses_blocking(exc: BaseException) -> bool:
    """True when an error reply to a blocking read (``XREAD … BLOCK``) says the server does not
    serve blocking reads (Upstash and proxies answer an ``ERR``): read without BLOCK and poll.

    Not WRONGTYPE (a foreign key: the caller ends that key's watchers), not NOPERM (an ACL that
    refuses XREAD refuses it with or without BLOCK), and not a transient reply (READONLY,
    LOADING, MOVED…: retried as before).
    """
    return error_code(exc) == "ERR"


def is_redis_fault(exc: BaseException) -> bool:
    """True for a fault of Redis or the network that a retry may get past.

    Connection resets and timeouts, READONLY (a failover turned the master into a replica),
    OOM (``maxmemory`` with ``noeviction``), LOADING, our own deadline (TimeoutError), a
    connection that redis-py closed under a command in flight (see :func:`_closed_under_us`),
    and a cluster client's slot refresh that reached no node because of such a fault (see
    :func:`_no_node_reached`).
    """
    return (
        isinstance(exc, RedisError | OSError | TimeoutError)
        or _closed_under_us(exc)
        or _no_node_reached(exc)
    )


def _no_node_reached(exc: BaseException) -> bool:
    """A ``RedisClusterException`` (not a ``RedisError``) raised by the cluster client's
    ``nodes_manager.initialize()`` when no startup node answered ``CLUSTER SLOTS``: "Redis
    Cluster cannot be connected…", raised ``from`` the last node's error.

    It is a fault when that error is one: a reset, a timeout, or a connection that redis-py
    closed under the refresh (its own ``aclose()`` after every fifth MOVED, from another task,
    see :func:`_closed_under_us`). A watch rerouting after MOVED during a resharding met it.
    When the cause is not a fault (``Cluster mode is not enabled on this node``: a
    ``RedisClusterException`` of its own), neither is the refresh's failure.
    """
    if not isinstance(exc, RedisClusterException):
        return False
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_redis_fault(cause)


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


Failure = Literal["corrupt", "unavailable"]
"""What a failed read means to whoever asked (an HTTP client, a CLI user)."""


def failure_of(exc: BaseException) -> Failure | None:
    """The one map of a failed read to what the adapters tell their users (the HTTP app's
    502 / 503, the CLI's exit codes): ``"corrupt"`` when the keys hold what jobpulse cannot
    read (:class:`~jobpulse.ProtocolError`), ``"unavailable"`` for a Redis fault
    (:func:`is_redis_fault`), None for anything else (a bug: the caller re-raises it)."""
    if isinstance(exc, ProtocolError):
        return "corrupt"
    if is_redis_fault(exc):
        return "unavailable"
    return None


@contextmanager
def tolerate_faults(on_fault: Callable[[BaseException], object]) -> Iterator[None]:
    """Run the block; a Redis fault (:func:`is_redis_fault`) is handed to ``on_fault`` and
    swallowed, anything else propagates. The one boundary of best-effort Redis calls::

        with tolerate_faults(lambda exc: warn("could not index: %r", exc)):
            await pipe.execute()
    """
    try:
        yield
    except Exception as exc:
        if not is_redis_fault(exc):
            raise
        on_fault(exc)
