"""``Event``: one entry of a job's events stream, typed (pure decoding, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .._protocol.codec import (
    TERMINAL_EVENT_KINDS,
    decode_entry,
    load_json,
    parse_stream_id,
    to_text,
)
from ..errors import ProtocolError

__all__ = ["Event", "decode_event", "synthetic_event"]

_MAX_SEQ = 2**64 - 1
"""The largest sequence part of a stream id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One checkpoint of a job, from its Redis Stream.

    Attributes:
        id: the stream entry id (``"1700000000000-0"``); pass it as ``last_event_id`` to resume.
        kind: ``start``, ``stage``, ``beat``, ``checkpoint``, ``cancel``, ``end`` or ``stale``.
        status: the snapshot status when the entry was written (``RUNNING``, ``COMPLETED``, …;
            ``STALE`` for the reader's own synthetic event).
        stage: the stage name, if any.
        done: items done.
        total: items in all, when known.
        seq: the snapshot's seq when the entry was written.
        fence: the fence of the attempt the entry belongs to (a ``stale`` entry carries the
            claim's fence). Every attempt opens with a ``start`` entry.
        attempt: the attempt's number (1 for a first run), on the entries the scripts write
            from the snapshot (``start``, ``cancel``, ``end``, ``stale``); None on ``beat``,
            ``stage`` and ``checkpoint`` entries (their ``fence`` names the attempt).
        ts: when the entry was written, in seconds since the epoch (Redis server clock).
        details: the entry's JSON details (checkpoint details, a cancel reason), else None.
        job_kind: the job's kind, on ``start`` entries of a job that has one.
        synthetic: True for the ``stale`` event a reader makes up when the worker's liveness
            key is gone and no sweeper has claimed the job yet (and the ``end`` it makes up for
            a finished job whose ``end`` entry is gone); see :func:`synthetic_event` for its
            ``id`` and ``ts``.
    """

    id: str
    kind: str
    status: str | None = None
    stage: str | None = None
    done: int | None = None
    total: int | None = None
    seq: int | None = None
    fence: int | None = None
    attempt: int | None = None
    ts: float | None = None
    details: Any = None
    job_kind: str | None = None
    synthetic: bool = False

    @property
    def terminal(self) -> bool:
        """True for ``end`` and ``stale``: this attempt's entries end here (a later attempt
        of the job id may append its own, opening with ``start``)."""
        return self.kind in TERMINAL_EVENT_KINDS


def _int(entry_id: str, fields: dict[str, str], name: str) -> int | None:
    text = fields.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ProtocolError(f"stream entry {entry_id}: {name}={text!r} is not an integer") from None


def decode_event(entry_id: str | bytes, raw: Any) -> Event:
    """Decode one stream entry (as redis-py returns it, bytes or str).

    Raises:
        ProtocolError: no ``kind``, a non-numeric number, non-JSON details or non-UTF-8 text.
    """
    try:
        eid = to_text(entry_id) or ""
        fields = decode_entry(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"stream entry {entry_id!r} is not jobpulse's: {exc}") from None
    kind = fields.get("kind")
    if kind is None:
        raise ProtocolError(f"stream entry {eid} has no kind")
    ts_ms = _int(eid, fields, "ts_ms")
    try:
        details = load_json(fields.get("details"))
    except orjson.JSONDecodeError:
        raise ProtocolError(f"stream entry {eid}: details are not JSON") from None
    return Event(
        id=eid,
        kind=kind,
        status=fields.get("status"),
        stage=fields.get("stage"),
        done=_int(eid, fields, "done"),
        total=_int(eid, fields, "total"),
        seq=_int(eid, fields, "seq"),
        fence=_int(eid, fields, "fence"),
        attempt=_int(eid, fields, "attempt") if fields.get("attempt") else None,
        ts=None if ts_ms is None else ts_ms / 1000.0,
        details=details,
        job_kind=fields.get("job_kind"),
    )


def synthetic_event(
    kind: str, status: str, *, cursor: str, server_ms: int | None, wall: float
) -> Event:
    """The event a reader makes up for a verdict (``stale``: the liveness key is gone).

    Its ``ts`` is the verdict's time: ``server_ms`` (the server's clock, read *before* the
    reader's last read of the stream) when known, else ``wall`` (the reader host's clock).

    Its ``id`` is a resume point of its own: ``(server_ms - 1)-18446744073709551615``, the last
    id of the millisecond before ``server_ms``, unless ``cursor`` (the last entry delivered) is
    above it. Every entry up to that id has been delivered (entries written before the stream
    was last read were read; ``cursor`` covers those of the last milliseconds), and an entry
    written later gets an id of at least ``server_ms`` (the server stamps ids with its clock),
    so a client resuming from it misses nothing and sees nothing twice. Without a server time
    the id is ``cursor``, the last delivered entry's.
    """
    eid = cursor
    if server_ms is not None and server_ms > 0:
        bound = (server_ms - 1, _MAX_SEQ)
        if bound > parse_stream_id(cursor):
            eid = f"{bound[0]}-{bound[1]}"
    ts = server_ms / 1000.0 if server_ms is not None and server_ms > 0 else wall
    return Event(id=eid, kind=kind, status=status, ts=ts, synthetic=True)
