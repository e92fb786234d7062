"""One snapshot read on the wire: ``HMGET`` + ``PTTL`` + ``TIME`` in one round trip.

Both readers (asyncio and sync) build the same :class:`ReadRequest` and decode its replies with
the same :meth:`ReadRequest.result`; only the write and the read of the bytes differ
(:func:`~jobpulse._protocol.wire.exchange` and ``exchange_sync``, or redis-py's pipeline).

On a plain client (``redis.Redis`` / ``redis.asyncio.Redis``, Sentinel-managed too) the read
skips redis-py's ``Pipeline``: the three commands are packed into one byte string (the field
names once per field set, :func:`pack_read`), written on one connection taken from the client's
pool, and their replies read back as the parser gives them (RESP2 or RESP3: an array, an
integer and an array). An error reply (WRONGTYPE, a refused TIME) is kept in its place and the
remaining replies are still read, so the connection stays in step. Connection faults and
timeouts go through the connection's own ``Retry``, as redis-py's commands do: the connection is
closed and the read sent again (a read is safe to replay). A read that is cancelled or fails
mid-way closes its connection before it goes back to the pool (redis-py's ``read_response``
does), so no later command can read a stale reply. An asyncio Redis Cluster
sends the commands through ``_protocol/cluster.py`` (redis-py's cluster pipeline routes them;
jobpulse follows MOVED, and ASK with ``ASKING`` on the same connection); the blocking cluster
client and a ``single_connection_client`` keep redis-py's pipeline (the single connection has
its own lock).

The server clock: each read asks the server's time in the same round trip (``TIME``, or the
name :func:`jobpulse.script_time` gave it after a ``rename-command``), so ages are server time
minus server time and the cache orders reads by the server's clock. Where the server refuses it
(renamed away, an ACL), the reader stops asking (:class:`ReadClock`) and stamps each read with
the reader host's wall clock, taken when the read is sent: ages are then off by the host's
offset from the server's clock (NTP keeps it within milliseconds), and reads are ordered by
when they were sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from redis.exceptions import ResponseError

from .._protocol.clock import clock_of
from .._protocol.errors import error_code, is_unknown_command, is_wrongtype
from .._protocol.keys import JobKeys
from .._protocol.wire import bulk, exchange, exchange_sync, fast_client
from ..errors import ProtocolError
from .status import (
    ALL_FIELDS,
    JobState,
    JobStatus,
    RawSnapshot,
    check_fields,
    decode_snapshot,
    decode_values,
    version,
    wanted,
)

__all__ = [
    "Read",
    "ReadClock",
    "ReadRequest",
    "exchange",
    "exchange_sync",
    "fast_client",
    "fields_to_read",
    "merge",
    "pack_read",
    "server_ms_of",
    "served",
]


_EVERY_FIELD = frozenset(ALL_FIELDS)


@dataclass(frozen=True, slots=True)
class Read:
    """One read (or a merge of reads of the same snapshot version), validated."""

    status: JobStatus
    raw: RawSnapshot
    fields: frozenset[str]
    version: tuple[int, int]
    exists: bool
    server_ms: int
    alive_pttl: int

    @property
    def terminal(self) -> bool:
        return self.status.state.is_terminal


def merge(older: Read, newer: Read) -> Read:
    """Two reads of one snapshot version: the union of their fields, the newer's liveness."""
    if older.fields <= newer.fields:
        return newer  # the newer read holds every field (the common case): nothing to add
    raw = {**older.raw, **newer.raw}
    status = decode_snapshot(older.status.job_id, raw, newer.alive_pttl, newer.server_ms)
    return replace(newer, status=status, raw=raw, fields=older.fields | newer.fields)


def fields_to_read(fields: Iterable[str] | None) -> frozenset[str]:
    """The fields ``get(job_id, fields)`` reads: every field for None, else the asked ones and
    the verdict's (see ``status.wanted``).

    Raises:
        ValueError: a name is not a snapshot field.
        TypeError: ``fields`` is a plain string or not iterable.
    """
    names = check_fields(fields)
    return _EVERY_FIELD if names is None else wanted(names)


def served(read: Read, age: float) -> JobStatus:
    """The status ``read`` answers ``age`` seconds after it was read (from the cache): its ages
    grew by as much, measured on the reader's own monotonic clock, never compared with another
    clock."""
    status = read.status
    if age <= 0 or not read.exists:
        return status
    return replace(status, heartbeat_age=_plus(status.heartbeat_age, age),
                   progress_age=_plus(status.progress_age, age))  # fmt: skip


def _plus(value: float | None, age: float) -> float | None:
    return None if value is None else value + age


# -- the bytes ---------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _hmget_tail(names: tuple[str, ...]) -> bytes:
    return b"".join(bulk(name.encode()) for name in names)


@lru_cache(maxsize=8)
def _time_packed(command: str) -> bytes:
    return b"*1\r\n" + bulk(command.encode())


def pack_read(
    state_key: str, alive_key: str, names: tuple[str, ...], time_command: str | None
) -> bytes:
    """The RESP of one read: ``HMGET state names…``, ``PTTL alive`` and ``time_command`` (when
    not None), in one write."""
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(names) + 2)
    pttl = b"*2\r\n$4\r\nPTTL\r\n" + bulk(alive_key.encode())
    tail = b"" if time_command is None else _time_packed(time_command)
    return b"".join((head, bulk(state_key.encode()), _hmget_tail(names), pttl, tail))


# -- the clock ---------------------------------------------------------------------------------


def server_ms_of(reply: Any) -> int:
    """A ``TIME`` reply (redis-py's parsed tuple, or the raw array of bytes or text) in ms."""
    seconds, micros = reply[0], reply[1]
    return int(seconds) * 1000 + int(micros) // 1000


def _refuses(exc: BaseException) -> bool:
    return is_unknown_command(exc) or error_code(exc) == "NOPERM"


class ReadClock:
    """Where one reader's server time comes from (see the module docstring).

    Args:
        client: the reader's Redis client; its :func:`~jobpulse._protocol.clock.clock_of`
            names the time command (``TIME``, or the one :func:`jobpulse.script_time` named).
        wall: the local wall clock (a seam for tests).

    Attributes:
        refused: the time command the server refused, or None. A refused command is not sent
            again by this reader, which stamps its reads with ``wall`` instead.
    """

    def __init__(self, client: Any, *, wall: Callable[[], float] = time.time) -> None:
        self._client = client
        self._wall = wall
        self.refused: str | None = None

    def command(self) -> str | None:
        """The time command to send with the next read, or None (the wall clock stands in)."""
        name = clock_of(self._client).time_command
        return None if name is None or name == self.refused else name

    def wall_ms(self) -> int:
        return int(self._wall() * 1000)

    def read_ms(self, command: str | None, reply: Any, sent_ms: int) -> int:
        """The server time of one read: its time reply, else ``sent_ms`` (the wall clock when
        the read was sent). A refusal switches this reader to the wall clock for good.

        Raises:
            redis.exceptions.RedisError: the time command failed for another reason.
        """
        if command is None:
            return sent_ms
        if isinstance(reply, ResponseError) and _refuses(reply):
            self.refused = command
            return sent_ms
        if isinstance(reply, BaseException):
            raise reply
        return server_ms_of(reply)


# -- one read, sans I/O ------------------------------------------------------------------------


class ReadRequest:
    """The commands of one read and the decoding of their replies.

    Args:
        job_id: the job.
        keys: its keys.
        want: the fields the read must return (the verdict fields included).
        clock: the reader's :class:`ReadClock`.
    """

    __slots__ = ("_clock", "command", "job_id", "keys", "names", "sent_ms", "want")

    def __init__(self, job_id: str, keys: JobKeys, want: frozenset[str], clock: ReadClock) -> None:
        self.job_id, self.keys, self.want, self._clock = job_id, keys, want, clock
        self.names = _names(want)
        self.command = clock.command()
        self.sent_ms = clock.wall_ms()

    @property
    def count(self) -> int:
        """Commands (and replies) in the read."""
        return 2 if self.command is None else 3

    def packed(self) -> bytes:
        return pack_read(self.keys.state, self.keys.alive, self.names, self.command)

    def commands(
        self, client: Any, *, cluster: bool
    ) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
        """The read as commands and their ``execute_command`` keyword arguments, for redis-py's
        pipeline (single-connection clients, the blocking cluster client) or
        ``cluster.pipelined`` (the asyncio cluster client, which follows ASK itself)."""
        commands: list[tuple[Any, ...]] = [
            ("HMGET", self.keys.state, *self.names),
            ("PTTL", self.keys.alive),
        ]
        options: list[dict[str, Any]] = [{}, {}]
        if self.command is not None:
            commands.append((self.command,))
            # On a cluster: the clock of the node that holds the job (the one its scripts
            # read), in the same round trip.
            node = client.get_node_from_key(self.keys.state) if cluster else None
            options.append({"target_nodes": node} if node is not None else {})
        return commands, options

    def result(self, replies: list[Any]) -> Read:
        """Decode the replies of the read.

        Raises:
            ProtocolError: the state key is not a hash, or the snapshot is corrupt.
            redis.exceptions.RedisError: another error reply.
        """
        job_id = self.job_id
        values, pttl = replies[0], replies[1]
        for reply in (values, pttl):
            if isinstance(reply, BaseException):
                if is_wrongtype(reply):
                    raise ProtocolError(f"job {job_id!r}: {self.keys.state} is not a hash")
                raise reply
        server_ms = self._clock.read_ms(
            self.command, replies[2] if self.command is not None else None, self.sent_ms
        )
        raw = decode_values(job_id, self.names, values)
        alive = int(pttl)
        status = decode_snapshot(job_id, raw, alive, server_ms)
        if status.state is JobState.UNKNOWN:  # not decoded: still refuse a corrupt order key
            return Read(status, raw, self.want, version(job_id, raw), False, server_ms, alive)
        order = (status.fence or 0, status.seq or 0)
        return Read(status, raw, self.want, order, True, server_ms, alive)


@lru_cache(maxsize=256)
def _names(want: frozenset[str]) -> tuple[str, ...]:
    return tuple(f for f in ALL_FIELDS if f in want)
