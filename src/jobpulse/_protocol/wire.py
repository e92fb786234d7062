"""Commands on the wire without redis-py's ``Pipeline``: RESP packing and one exchange.

The reader (``_reader/fetch.py``) and both tickers (``_worker/ticker.py``,
``_worker/thread_ticker.py``) use it on a plain client (``redis.Redis`` /
``redis.asyncio.Redis``, Sentinel-managed too; :func:`fast_client`): their commands are packed
into one byte string (:func:`pack`: hiredis's ``pack_command``, in C, where hiredis is
installed, as it is through the ``redis[hiredis]`` dependency; else :func:`pack_python`, the
same bytes in Python), written on one connection taken from the client's pool, and the replies read
back as the parser gives them (RESP2 or RESP3). An error reply is kept in its place and the
remaining replies are still read, so the connection stays in step; the list has the shape of
``pipe.execute(raise_on_error=False)``. Connection faults and timeouts go through the
connection's own ``Retry``, as redis-py's commands do: the connection is closed and the whole
write sent again, so only commands safe to replay may be sent here (a read; a beat, which a
replay of the same seq leaves as one; ``ZADD GT``). An exchange that is cancelled or fails
mid-way closes its connection before it goes back to the pool (redis-py's ``read_response``
does), so no later command can read a stale reply. An asyncio Redis Cluster
sends the commands through ``_protocol/cluster.py`` (redis-py's cluster pipeline routes them;
jobpulse follows MOVED, and ASK with ``ASKING`` on the same connection); the blocking cluster
client and a ``single_connection_client`` keep redis-py's pipeline (the single connection has
its own lock).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ResponseError

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # an install without hiredis: pack_python packs the same bytes
    _hiredis_pack = None

__all__ = [
    "HIREDIS_PACK",
    "bulk",
    "exchange",
    "exchange_sync",
    "fast_client",
    "pack",
    "pack_python",
    "zadd",
]

HIREDIS_PACK = _hiredis_pack is not None
"""True when :func:`pack` is hiredis's packer (False: :func:`pack_python`)."""


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _text(value: str) -> bytes:
    data = value.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _int(value: int) -> bytes:
    data = b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _float(value: float) -> bytes:
    return _text(repr(value))


_ENCODE: dict[type, Callable[[Any], bytes]] = {bytes: bulk, str: _text, int: _int, float: _float}


def _arg(value: Any) -> bytes:
    encode = _ENCODE.get(type(value))
    if encode is None:
        raise TypeError(f"cannot send {type(value).__name__} {value!r} to Redis")
    return encode(value)


def pack_python(args: Sequence[Any]) -> bytes:
    """The RESP of one command in Python (:func:`pack` where hiredis is not installed): bytes
    as they are, text as UTF-8, integers and floats as redis-py writes them (``repr`` for a
    float).

    Raises:
        TypeError: an argument is not bytes, str, int or float (a bool is refused).
    """
    return b"*%d\r\n%s" % (len(args), b"".join([_arg(a) for a in args]))


def _with(packer: Callable[[tuple[Any, ...]], bytes]) -> Callable[[Sequence[Any]], bytes]:
    def pack_hiredis(args: Sequence[Any]) -> bytes:
        """The RESP of one command, by hiredis (C, ~3x faster than :func:`pack_python` on a
        beat): the same bytes. An argument hiredis refuses is named by :func:`pack_python`'s
        error."""
        try:
            return packer(tuple(args))
        except TypeError:
            return pack_python(args)  # raises, naming the argument

    return pack_hiredis


pack = pack_python if _hiredis_pack is None else _with(_hiredis_pack)
"""The RESP of one command: bytes as they are, text as UTF-8, integers and floats as redis-py
writes them (``repr`` for a float); hiredis's packer where it is installed, else
:func:`pack_python`.

Raises:
    TypeError: an argument is not bytes, str, int or float (a bool is refused).
"""


def zadd(key: str, members: dict[str, int], *flags: str) -> list[Any]:
    """The arguments of ``ZADD key [flags] score member …`` (``flags``: ``GT``, ``XX``)."""
    args: list[Any] = ["ZADD", key, *flags]
    for member, score in members.items():
        args += (score, member)
    return args


def fast_client(client: Any) -> bool:
    """True when commands go as packed bytes on a pooled connection: a plain client, not a
    cluster and not a ``single_connection_client``."""
    plain = isinstance(client, redis.asyncio.Redis | redis.Redis)
    return plain and getattr(client, "connection", None) is None


async def _send(conn: Any, packed: bytes, count: int) -> list[Any]:
    await conn.send_packed_command([packed])
    bound = conn.socket_timeout
    if not bound or count == 1:
        return await _read(conn, count, None)
    # One time bound for all the replies (redis-py would arm and cancel one per reply): a
    # reply late past the socket timeout fails as redis-py's would (the connection closed,
    # redis-py's TimeoutError, which the connection's Retry retries).
    try:
        async with asyncio.timeout(bound):
            return await _read(conn, count, math.inf)
    except TimeoutError:
        raise redis.exceptions.TimeoutError("Timeout reading the replies of a write") from None


async def _read(conn: Any, count: int, bound: float | None) -> list[Any]:
    """``count`` replies; each read bounded by ``bound`` (None: the socket timeout; inf:
    none)."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response(timeout=bound))
        except ResponseError as exc:  # an error reply: keep reading the others
            replies.append(exc)
    return replies


async def exchange(client: Any, packed: bytes, count: int) -> list[Any]:
    """Write ``packed`` (``count`` commands) on one connection of ``client``'s pool and read
    the ``count`` replies, error replies in their place (asyncio client)."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        replies: list[Any] = await conn.retry.call_with_retry(
            lambda: _send(conn, packed, count), lambda _error: conn.disconnect()
        )
        return replies
    finally:
        await pool.release(conn)


def _send_sync(conn: Any, packed: bytes, count: int) -> list[Any]:
    conn.send_packed_command([packed])
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def exchange_sync(client: Any, packed: bytes, count: int) -> list[Any]:
    """:func:`exchange` for a blocking client."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        replies: list[Any] = conn.retry.call_with_retry(
            lambda: _send_sync(conn, packed, count), lambda _error: conn.disconnect()
        )
        return replies
    finally:
        pool.release(conn)
