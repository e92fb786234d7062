"""When a watch ends, and with what: the follow rules of every driver that follows a job's
stream (pure, no I/O).

The drivers: the asyncio reader (``watch.Watch`` over the hub's ``xread.XReadLoop``), the sync
reader (``SyncStatusReader.watch``, XREAD BLOCK on the caller's thread) and ``wait()`` of both,
which follows a watch to its end. Each only reads, waits and yields; what follows decides.

The rules:
  1. *Superseded run.* A job id's stream holds every attempt, each opening with a ``start``
     entry. A terminal entry (``end``, ``stale``) that a later ``start`` follows belongs to an
     earlier attempt: it is yielded, and the watch goes on (:func:`superseded`,
     :func:`ends_watch`), so a watch follows the job's last attempt to its end.
  2. *Liveness verdict.* A followed job with no new entry for a while is checked with
     :func:`liveness_commands` (its snapshot's ``status`` and the liveness key's PTTL, one
     pipeline): :func:`liveness_verdict` says STALE (RUNNING, liveness key gone), the terminal
     status (the job ended), or None (running, or not started yet: keep following). The verdict
     is the one ``get()`` makes (``status.state_of``).
  3. *Synthetic end.* On a verdict the driver reads the stream past its cursor and yields what
     it holds; unless that holds a terminal entry, the watch ends with :func:`synthetic_event`:
     ``stale`` (status ``STALE``) for a dead worker nobody claimed, ``end`` with the final status
     for a job whose ``end`` entry is gone (trimmed by ``MAXLEN``, deleted). Its ``ts`` is the
     verdict's time and its id a resume point that loses and repeats nothing
     (``event.synthetic_event``).
  4. *Snapshot order.* Whoever follows a job through its snapshot instead of its stream (the
     HTTP long poll) orders them by :func:`order_of`: a later run (fence) supersedes, then
     ``seq``, then STALE after the RUNNING it was derived from, then a pending cancel request.
  5. *Waiting.* ``wait()`` reads the status and, by :func:`wait_step`, returns it (settled:
     terminal or STALE), follows the stream to its end (RUNNING) from :func:`follow_from`, or
     polls (UNKNOWN: not started yet).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any, Literal

from .._protocol.codec import parse_stream_id, to_text
from .event import Event
from .event import synthetic_event as make_synthetic
from .status import JobState, JobStatus, state_of

__all__ = [
    "WaitStep",
    "ends_watch",
    "follow_from",
    "liveness_commands",
    "liveness_verdict",
    "order_of",
    "resume_point",
    "superseded",
    "synthetic_event",
    "verdict_of",
    "wait_step",
]

WaitStep = Literal["settled", "follow", "poll"]
"""What ``wait()`` does after a read of the job's status."""


def superseded(items: Iterable[Event | BaseException]) -> set[str]:
    """The ids of the terminal entries in ``items`` (stream order) that a later ``start``
    follows: they end an earlier attempt, not the watch."""
    later_start = False
    found: set[str] = set()
    for item in reversed(list(items)):
        if not isinstance(item, Event):
            continue
        if item.kind == "start":
            later_start = True
        elif item.terminal and later_start:
            found.add(item.id)
    return found


def ends_watch(event: Event, superseded: Container[str]) -> bool:
    """True when the watch ends once ``event`` is yielded: a terminal entry of the job's last
    attempt (one not in ``superseded``), or a synthetic event."""
    return event.terminal and (event.synthetic or event.id not in superseded)


def liveness_commands(state_key: str, alive_key: str) -> list[tuple[str, ...]]:
    """The liveness check of one followed job: its snapshot's ``status`` and the liveness key's
    PTTL (both keys share the job's hash slot: one pipeline, also on a cluster)."""
    return [("HGET", state_key, "status"), ("PTTL", alive_key)]


def liveness_verdict(status: Any, alive_pttl: Any) -> JobState | None:
    """The verdict of a liveness check from its two replies (see :func:`liveness_commands`).

    Returns:
        STALE (RUNNING without its liveness key), the terminal state of a job that ended, or
        None: keep following (running; not started yet; a reply that is an error, not UTF-8 or
        not a jobpulse status says nothing).
    """
    if isinstance(status, BaseException) or not isinstance(alive_pttl, int):
        return None
    try:
        text = to_text(status)
    except UnicodeDecodeError:
        return None
    if text is None:
        return None  # no snapshot (yet): a watch of a job not started waits for its start
    state = state_of(text, alive_pttl)
    return None if state is None else verdict_of(state)


def verdict_of(state: JobState) -> JobState | None:
    """The liveness verdict on a job in ``state`` (``status.state_of``'s verdict, from a
    liveness check or a full read): ``state`` when it ends a watch (terminal, or STALE), else
    None (keep following)."""
    return state if state.is_settled else None


def synthetic_event(verdict: JobState, *, cursor: str, server_ms: int | None, wall: float) -> Event:
    """The event that ends a watch on ``verdict`` when the stream holds no terminal entry past
    ``cursor`` (the last real entry's id, or ``"0-0"``): ``stale`` for STALE, else ``end``;
    its time and its resumable id are :func:`~.event.synthetic_event`'s (``server_ms``: the
    server's clock, read before the driver's last read of the stream, or None)."""
    kind = "stale" if verdict is JobState.STALE else "end"
    return make_synthetic(kind, verdict.value, cursor=cursor, server_ms=server_ms, wall=wall)


def wait_step(state: JobState) -> WaitStep:
    """What ``wait()`` does with a job in ``state``: ``"settled"`` (terminal or STALE: return
    the status), ``"follow"`` (RUNNING: follow the stream to its end, then read again) or
    ``"poll"`` (UNKNOWN: not started yet, read again after a pause)."""
    if state.is_settled:
        return "settled"
    return "follow" if state is JobState.RUNNING else "poll"


def follow_from(tail: Sequence[Any]) -> str | None:
    """Where ``wait()`` follows a running job's stream from, given its two newest entries
    (``XREVRANGE … COUNT 2``): right after the one before the newest, so an attempt that already
    ended ends the watch at once without replaying the history; None (the stream's start) when
    the stream holds fewer than two entries."""
    return to_text(tail[1][0]) if len(tail) == 2 else None


def order_of(status: JobStatus) -> tuple[int, int, bool, bool]:
    """The order of a job's snapshots: ``(fence, seq)`` (a later run supersedes an earlier
    one), then STALE after its RUNNING, then a cancel request (``cancel.lua`` sets its flag
    without a new seq; the ETag shows it)."""
    stale = status.state is JobState.STALE
    return (status.fence or 0, status.seq or 0, stale, bool(status.cancel_requested))


def resume_point(last_event_id: str | None) -> tuple[tuple[int, int], str | None]:
    """Where a watch starts: right after ``last_event_id`` (its parsed id, and its text as
    ``ms-seq``), or the stream's start (``((0, 0), None)``) for None.

    Raises:
        ValueError: ``last_event_id`` is not a stream entry id (before any Redis call).
    """
    if last_event_id is None:
        return (0, 0), None
    try:
        parsed = parse_stream_id(last_event_id)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(
            f"last_event_id must be a stream entry id like '1700000000000-0', got {last_event_id!r}"
        ) from None
    return parsed, f"{parsed[0]}-{parsed[1]}"
