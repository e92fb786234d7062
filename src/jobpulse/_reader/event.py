"""``Event``: one entry of a job's events stream, typed (pure decoding, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .._protocol.codec import TERMINAL_EVENT_KINDS, decode_entry, load_json, to_text
from ..errors import ProtocolError

__all__ = ["Event", "decode_event"]


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
            key is gone and no sweeper has claimed the job yet; its ``id`` is the last real
            entry's id, so resuming from it loses nothing.
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
