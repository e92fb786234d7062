"""``JobState``, ``JobStatus`` and the pure decoding of one snapshot read (no I/O).

A read is the HMGET of some snapshot fields, the liveness key's PTTL and the server's TIME,
taken in one pipeline. Everything here is a function of those values, so the verdict (STALE or
not) and the ages never compare the reader's clock with the worker's.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

import orjson

from .._protocol.codec import SNAPSHOT_FIELDS, STATUSES, TERMINAL_STATUSES, to_text
from ..errors import ProtocolError

__all__ = [
    "ALL_FIELDS",
    "LIVE_STATES",
    "VERDICT_FIELDS",
    "JobState",
    "JobStatus",
    "RawSnapshot",
    "check_fields",
    "decode_snapshot",
    "decode_values",
    "live_statuses",
    "state_of",
    "version",
    "wanted",
]

ALL_FIELDS: tuple[str, ...] = (*SNAPSHOT_FIELDS, "cancel")
"""What ``get(job_id)`` fetches: the contract's snapshot fields and the cancel flag."""

VERDICT_FIELDS: tuple[str, ...] = ("status", "seq", "fence", "heartbeat_ms", "progress_ms")
"""Fetched on every read, whatever fields were asked: the state, the ordering and the ages."""

RawSnapshot = Mapping[str, str | None]
"""The text of the fetched fields (``None`` when absent); fields not fetched are missing."""


class JobState(enum.Enum):
    """What a reader can say about a job."""

    RUNNING = "RUNNING"
    """A worker holds the job and its liveness key is present."""
    STALE = "STALE"
    """The snapshot says RUNNING but the liveness key is gone: the worker is dead or cut off and
    nobody has claimed the job yet. Derived by readers, never written."""
    COMPLETED = "COMPLETED"
    """The body returned."""
    FAILED = "FAILED"
    """The body raised; ``error`` holds ``"Type: message"``."""
    CANCELLED = "CANCELLED"
    """The job was cancelled (remotely or by its own task)."""
    LOST = "LOST"
    """The attempt lost its lease (claimed by a sweeper, or it expired while Redis was away)."""
    UNKNOWN = "UNKNOWN"
    """No snapshot: no such job, not started yet, or expired after its retention."""

    @property
    def is_terminal(self) -> bool:
        """True for COMPLETED, FAILED, CANCELLED and LOST: this attempt will not change again."""
        return self.value in TERMINAL_STATUSES

    @property
    def is_settled(self) -> bool:
        """True for a terminal state or STALE: what :meth:`StatusReader.wait` returns at."""
        return self is JobState.STALE or self.is_terminal


LIVE_STATES = frozenset({JobState.RUNNING, JobState.STALE})
"""A job whose attempt has not ended: the running-jobs index names it, a job list shows it, and
its status may change by itself (a beat, the end, a claim)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    """One job's status as read from its snapshot. Fields not fetched, or absent, are None.

    Attributes:
        job_id: the job.
        state: the verdict (a :class:`JobState`).
        stage: the current stage name.
        done: items done.
        total: items in all, when known.
        percent: ``100 * done / total`` rounded down to two decimals (None without a positive
            total), at most 100.
        rate: items per second, recent.
        eta: seconds left, estimated by the worker.
        rss_bytes: the worker process's resident memory.
        cpu_seconds: the worker process's CPU time.
        loop_lag: how late the last beat fired on the worker's event loop, in seconds.
        seq: the snapshot's sequence number (grows with every write of one attempt).
        fence: the attempt's fencing number (grows across attempts).
        attempt: 1 for a first run, n + 1 after a takeover.
        worker: the worker's name (``host:pid`` by default).
        heartbeat_age: seconds since the last beat, by the Redis server's clock.
        progress_age: seconds since ``done`` last changed, by the Redis server's clock.
        error: ``"Type: message"`` of a FAILED job, or why a job is LOST.
        meta: the job's ``meta`` (decoded JSON).
        kind: the job's kind (``heartbeat(..., kind=...)``), None when it has none.
        started_ms: when the attempt started (Redis server time, ms).
        heartbeat_ms: when the last beat was written (Redis server time, ms).
        progress_ms: when ``done`` last changed (Redis server time, ms).
        finished_ms: when the job ended (Redis server time, ms).
        cancel_requested: True while a cancel request waits for the worker.
        server_ms: the Redis server's time when this snapshot was read (ms).
    """

    job_id: str
    state: JobState
    stage: str | None = None
    done: int | None = None
    total: int | None = None
    percent: float | None = None
    rate: float | None = None
    eta: float | None = None
    rss_bytes: int | None = None
    cpu_seconds: float | None = None
    loop_lag: float | None = None
    seq: int | None = None
    fence: int | None = None
    attempt: int | None = None
    worker: str | None = None
    heartbeat_age: float | None = None
    progress_age: float | None = None
    error: str | None = None
    meta: Any = None
    kind: str | None = None
    started_ms: int | None = None
    heartbeat_ms: int | None = None
    progress_ms: int | None = None
    finished_ms: int | None = None
    cancel_requested: bool | None = None
    server_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values (``state`` as its name, e.g. ``"RUNNING"``)."""
        out = asdict(self)
        out["state"] = self.state.name
        return out


def live_statuses(results: Iterable[JobStatus | BaseException]) -> list[JobStatus]:
    """What a job list shows of the results of reading its jobs (``gather(...,
    return_exceptions=True)``): the statuses in :data:`LIVE_STATES`, in order. A job that just
    ended is left out, and so is a corrupt one (``ProtocolError``): it does not hide the others.

    Raises:
        BaseException: the first other failure among ``results`` (a Redis fault, a bug).
    """
    listed = []
    for result in results:
        if isinstance(result, JobStatus):
            if result.state in LIVE_STATES:
                listed.append(result)
        elif not isinstance(result, ProtocolError):
            raise result
    return listed


def check_fields(fields: object) -> tuple[str, ...] | None:
    """Validate the ``fields=`` argument of ``get()``: None or an iterable of field names.

    Raises:
        ValueError: a name is not a snapshot field (the message lists the valid ones).
        TypeError: ``fields`` is a plain string or not iterable.
    """
    if fields is None:
        return None
    if isinstance(fields, str | bytes):
        raise TypeError("fields must be a sequence of field names, not a single string")
    try:
        names: tuple[str, ...] = tuple(fields)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"fields must be a sequence of field names, got {fields!r}") from None
    unknown = [f for f in names if f not in ALL_FIELDS]
    if unknown:
        raise ValueError(f"fields has unknown names {unknown!r}; valid: {', '.join(ALL_FIELDS)}")
    return names


@lru_cache(maxsize=256)
def wanted(names: tuple[str, ...]) -> frozenset[str]:
    """The fields a read of ``names`` (checked by :func:`check_fields`) fetches: those and the
    verdict fields."""
    return frozenset((*VERDICT_FIELDS, *names))


def decode_values(
    job_id: str, names: Sequence[str], values: Sequence[str | bytes | None]
) -> dict[str, str | None]:
    """An HMGET reply as text per field.

    Raises:
        ProtocolError: a value is not UTF-8, or the reply does not match the fields asked.
    """
    if len(values) != len(names):
        raise ProtocolError(f"job {job_id!r}: HMGET gave {len(values)} values for {len(names)}")
    try:  # bytes (redis-py without decode_responses) inline; "" is absent, as in to_text
        return {
            name: (value.decode() or None) if value.__class__ is bytes else to_text(value)
            for name, value in zip(names, values, strict=True)
        }
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"job {job_id!r}: a snapshot value is not UTF-8 ({exc})") from None


def _int(job_id: str, raw: RawSnapshot, name: str) -> int | None:
    text = raw.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ProtocolError(
            f"job {job_id!r}: snapshot field {name}={text!r} is not an integer"
        ) from None


def _float(job_id: str, raw: RawSnapshot, name: str) -> float | None:
    text = raw.get(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ProtocolError(f"job {job_id!r}: snapshot field {name}={text!r} is not a number")
    return value


def _age(server_ms: int, at_ms: int | None) -> float | None:
    return None if at_ms is None else max(server_ms - at_ms, 0) / 1000.0


def version(job_id: str, raw: RawSnapshot) -> tuple[int, int]:
    """The snapshot's ``(fence, seq)`` order key (absent = 0).

    Raises:
        ProtocolError: ``fence`` or ``seq`` is not an integer (also in a hash with no status).
    """
    return _int(job_id, raw, "fence") or 0, _int(job_id, raw, "seq") or 0


def state_of(status: str, alive_pttl: int) -> JobState | None:
    """The reader's verdict on a job from its snapshot's ``status`` and its liveness key's PTTL
    (-2 when the key is missing): STALE for RUNNING without the key, else the status's own
    state; None for a status outside the protocol. Made here only: ``get()`` and every watch's
    liveness check (``follow.liveness_verdict``) ask this."""
    if status not in STATUSES:
        return None
    if status == "RUNNING" and alive_pttl == -2:
        return JobState.STALE
    return JobState(status)


def decode_snapshot(job_id: str, raw: RawSnapshot, alive_pttl: int, server_ms: int) -> JobStatus:
    """Build the :class:`JobStatus` of one read: one straight pass over the fields (no
    per-field dispatch), then :func:`_new_status`. Every check happens here, before the
    status exists: a corrupt snapshot raises from ``get()`` itself.

    Args:
        job_id: the job.
        raw: the text of the fetched fields (see :data:`RawSnapshot`).
        alive_pttl: the liveness key's PTTL (-2 when the key is missing).
        server_ms: the Redis server's time of the read, in ms.

    Returns:
        UNKNOWN when the snapshot has no ``status`` (no hash, or a foreign one without it).

    Raises:
        ProtocolError: a status outside the protocol, a non-numeric number field, or a ``meta``
            that is not JSON.
    """
    get = raw.get
    status = get("status")
    if status is None:
        return JobStatus(job_id=job_id, state=JobState.UNKNOWN, server_ms=server_ms)
    state = _STATES.get(status)
    if state is None:
        raise ProtocolError(f"job {job_id!r}: snapshot status {status!r} is not a jobpulse status")
    if state is JobState.RUNNING and alive_pttl == -2:
        state = JobState.STALE
    # integers: the common case (ASCII digits) without a try per field; else _int decides
    t = get("done")
    done = (
        None if t is None else int(t) if t.isdigit() and t.isascii() else _int(job_id, raw, "done")
    )
    t = get("total")
    total = (
        None if t is None else int(t) if t.isdigit() and t.isascii() else _int(job_id, raw, "total")
    )
    t = get("rss_bytes")
    rss = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "rss_bytes")
    )
    t = get("seq")
    seq = None if t is None else int(t) if t.isdigit() and t.isascii() else _int(job_id, raw, "seq")
    t = get("fence")
    fence = (
        None if t is None else int(t) if t.isdigit() and t.isascii() else _int(job_id, raw, "fence")
    )
    t = get("attempt")
    attempt = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "attempt")
    )
    t = get("started_ms")
    started = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "started_ms")
    )
    t = get("heartbeat_ms")
    beat_ms = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "heartbeat_ms")
    )
    t = get("progress_ms")
    progress = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "progress_ms")
    )
    t = get("finished_ms")
    finished = (
        None
        if t is None
        else int(t)
        if t.isdigit() and t.isascii()
        else _int(job_id, raw, "finished_ms")
    )
    rate = None if get("rate") is None else _float(job_id, raw, "rate")
    eta = None if get("eta_s") is None else _float(job_id, raw, "eta_s")
    cpu = None if get("cpu_s") is None else _float(job_id, raw, "cpu_s")
    lag = None if get("loop_lag_ms") is None else _float(job_id, raw, "loop_lag_ms")
    t = get("meta")
    try:
        meta = orjson.loads(t) if t else None
    except orjson.JSONDecodeError:
        raise ProtocolError(f"job {job_id!r}: snapshot field meta is not JSON") from None
    percent = None
    if done is not None and total is not None and total > 0:
        # Two decimals, rounded down: 733 / 1500 is 48.86, not 48.86666666666667, and only
        # done >= total reads 100.
        percent = min(math.floor(10_000 * done / total) / 100, 100.0)
    cancel = (get("cancel") == "1") if "cancel" in raw else None
    return _new_status(
        job_id,
        state,
        get("stage"),
        done,
        total,
        percent,
        rate,
        eta,
        rss,
        cpu,
        None if lag is None else lag / 1000.0,
        seq,
        fence,
        attempt,
        get("worker"),
        None if beat_ms is None else max(server_ms - beat_ms, 0) / 1000.0,
        None if progress is None else max(server_ms - progress, 0) / 1000.0,
        get("error"),
        meta,
        get("kind"),
        started,
        beat_ms,
        progress,
        finished,
        cancel,
        server_ms,
    )


_STATES = {status: JobState(status) for status in STATUSES}


def _status_builder() -> Callable[..., JobStatus]:
    """A constructor of :class:`JobStatus` taking every field positionally, in declaration
    order, that sets the slots directly: the frozen dataclass's keyword ``__init__`` (one
    ``object.__setattr__`` per field) is most of a read's decode otherwise. The instance is
    the same frozen class, equal to one built by ``JobStatus(...)`` (a unit test checks)."""
    names = [f.name for f in fields(JobStatus)]
    source = (
        f"def new_status({', '.join(names)}):\n    o = _new(_cls)\n"
        + "".join(f"    _set_{n}(o, {n})\n" for n in names)
        + "    return o\n"
    )
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": JobStatus}
    scope.update({f"_set_{n}": getattr(JobStatus, n).__set__ for n in names})
    exec(source, scope)  # a fixed text, built from the dataclass's own field names
    builder: Callable[..., JobStatus] = scope["new_status"]
    return builder


_new_status = _status_builder()
