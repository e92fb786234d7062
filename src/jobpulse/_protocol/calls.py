"""One typed call per Lua script: argument encoding, reply type, named reply codes, decoding.

A :class:`Call` is sans-I/O: it holds the script, its keys and encoded arguments, and the decoder
of its reply. The two drivers, :func:`run` (asyncio) and :func:`run_sync` (threads), are the only
code that sends one; they are the few-line twins this layer allows, and the NOSCRIPT reload
(after a restart or SCRIPT FLUSH) is written once, in :meth:`Call.reload` and
:func:`scripts_to_load`. The client's :class:`~jobpulse._protocol.clock.ScriptClock` decides
where a timed script's time comes from: the drivers stamp every call with it, and pipelined
callers (the tickers, the sweeper) put :meth:`Call.command`, passed through
``clock_of(client).stamp``, in their pipeline, decode each reply with :meth:`Call.decode`, and
load (the clock's variant of) what :func:`scripts_to_load` names before sending again.

The codes and reply shapes are those of the contract headers in ``lua/*.lua``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from .clock import clock_of
from .cluster import execute, is_async_cluster
from .codec import text
from .errors import is_noscript
from .scripts import SCRIPTS, Script

__all__ = [
    "AcquireCode",
    "AcquireReply",
    "BeatCode",
    "BeatReply",
    "Call",
    "CancelCode",
    "ClaimCode",
    "ClaimReply",
    "FinishCode",
    "ack",
    "BEAT_DIGITS",
    "BEAT_FIELDS",
    "acquire",
    "beat",
    "beat_command",
    "beat_keys",
    "beat_segment",
    "encode_beat",
    "beats",
    "cancel",
    "claim",
    "decode_beat",
    "decode_beats",
    "enroll",
    "finish",
    "run",
    "run_sync",
    "scripts_to_load",
    "tally",
    "text",
    "unindex",
]

R = TypeVar("R")


class AcquireCode(enum.IntEnum):
    """``acquire.lua``'s first reply element."""

    STARTED = 1
    BUSY = 0  # another live worker holds the job
    TOO_LATE = -1  # the index entry may already be gone: nothing was started


class BeatCode(enum.IntEnum):
    """``beat.lua``'s reply code."""

    SEQ_BEHIND = 0  # lease renewed, the snapshot holds a newer seq: nothing else written
    WRITTEN = 1
    RETAKEN = 2  # written, the lease was re-taken after it expired
    RESEND_STATIC = 3  # the snapshot lost writes that landed: nothing written, resend every field
    TAKEN_OVER = -1  # another token holds the lease
    FENCED_OUT = -2  # the fence moved on
    RESEND_KEYS = -3  # a beat of the regular path's keys needs the fence: nothing written, resend


class FinishCode(enum.IntEnum):
    """``finish.lua``'s reply code."""

    WRITTEN = 1
    ALREADY_ENDED = 0  # also the answer to a replay of our own final write
    TAKEN_OVER = -1
    FENCED_OUT = -2


class ClaimCode(enum.IntEnum):
    """``claim.lua``'s first reply element."""

    CLAIMED = 1  # a new claim, or one made earlier and never acknowledged
    NOT_RUNNING = 0  # ended or unknown: drop the index entry
    ALIVE = -1  # the job is live: its reply carries the lease time left


class CancelCode(enum.IntEnum):
    """``cancel.lua``'s reply."""

    NOT_RUNNING = 0
    REQUESTED = 1
    ALREADY_REQUESTED = 2


@dataclass(frozen=True, slots=True)
class AcquireReply:
    code: AcquireCode
    fence: int = 0
    attempt: int = 0
    seq: int = 0
    resume: str = ""  # the previous attempt's last checkpoint (JSON) or ""
    started_ms: int = 0


class BeatReply(NamedTuple):
    """One job's answer to a beat (a named tuple: one is decoded per beat, and a frozen
    dataclass costs several times more to build)."""

    code: BeatCode
    cancel: bool
    now_ms: int  # 0 when refused (the script answers before reading the clock)
    snapshot_seq: int


_BEAT_CODES = {code.value: code for code in BeatCode}
"""Each reply code's member by value: a dict lookup, not an enum call, per beat."""


def decode_beat(reply: Any) -> BeatReply:
    """One job's answer in ``beat.lua``'s reply: one integer (``now_ms * 8 + code * 2 +
    cancel``, or a negative code), or ``{0, cancel, now_ms, snapshot_seq}`` when the snapshot
    holds a newer seq."""
    if reply.__class__ is int:
        if reply < 0:
            return BeatReply(BeatCode(reply), False, 0, 0)
        return BeatReply(_BEAT_CODES[(reply >> 1) & 3], reply & 1 == 1, reply >> 3, 0)
    if isinstance(reply, int):  # an int subclass: the general path
        return decode_beat(int(reply))
    code, cancel, now_ms, snapshot_seq = (int(x) for x in reply[:4])
    return BeatReply(BeatCode(code), cancel == 1, now_ms, snapshot_seq)


def decode_beats(reply: Any) -> list[BeatReply | Exception]:
    """``beat.lua``'s reply: per job, its :class:`BeatReply`, or the error of a command that
    failed for that job alone (the batch's other jobs are unaffected)."""
    return [r if isinstance(r, Exception) else decode_beat(r) for r in reply]


BEAT_FIELDS = ("done", "total", "stage", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms")
"""``beat.lua``'s dynamic fields, in the order its digits (1-8) name them."""

BEAT_DIGITS = "12345678"
"""``beat.lua``'s name of each of :data:`BEAT_FIELDS`, by index."""


def encode_beat(
    head: Sequence[Any],
    seq: int,
    landed: int,
    present: Sequence[int],
    values: Sequence[Any],
    event: tuple[str, str, int] | None = None,
    pairs: Sequence[Any] = (),
    done_moved: bool | None = True,
    every_key: bool = True,
) -> list[Any]:
    """One job's segment of a ``beat.lua`` call, its length first: THE beat encoder (the
    tickers' machines, :func:`beat_segment`, tests and benchmarks all build beats with it).
    ``head``: token, fence, ``ttl_ms`` (the machines pass them pre-encoded); ``landed``: the
    highest seq known to be in the snapshot (a snapshot behind it answers
    :attr:`BeatCode.RESEND_STATIC`, writing nothing of the beat; 0: no check); ``present``: the
    indexes in :data:`BEAT_FIELDS` of the fields sent, ascending, and ``values`` theirs;
    ``event``: ``(kind, details, maxlen)`` of a stream entry; ``pairs``: field, value pairs
    written as they are (static fields, the checkpoint); ``done_moved``, when ``done`` is sent:
    True, it moved (``progress_ms`` moves); False, it is sent unchanged (with a stream entry:
    names prefixed ``=``, ``progress_ms`` stays); None, the worker does not know the stored
    value (names prefixed ``~``: the script compares before it moves ``progress_ms``);
    ``every_key``: the beat is sent with every key of :meth:`JobKeys.beat`, else (its length
    negated) with the first two, or three with ``event`` (:func:`beat_keys` picks them); such a
    beat answers :attr:`BeatCode.RESEND_KEYS` when it needs the fence."""
    sent_done = bool(present) and present[0] == 0
    mark = "" if done_moved or not sent_done else "~" if done_moved is None else "="
    names = mark + "".join([BEAT_DIGITS[i] for i in present])
    segment: list[Any] = [0, *head, seq, landed, names + "+" if event else names, *values]
    if event:
        segment += event
    segment += pairs
    segment[0] = len(segment) - 1 if every_key else 1 - len(segment)
    return segment


def beat_keys(keys: Sequence[Any], segment: Sequence[Any]) -> tuple[Any, ...]:
    """The keys a beat ``segment`` sends, of one job's keys in ``beat.lua``'s order
    (:meth:`~jobpulse._protocol.keys.JobKeys.beat`): all four, or state and alive (and events
    when the segment carries a stream entry) when it was encoded without ``every_key``."""
    if int(segment[0]) > 0:
        return tuple(keys)
    return tuple(keys[:3] if str(segment[6]).endswith("+") else keys[:2])


def beat_segment(
    *,
    token: str,
    fence: int,
    ttl_ms: int,
    seq: int,
    landed: int | None = None,
    fields: dict[str, Any],
    event: tuple[str, str, int] | None = None,
    pairs: Sequence[Any] = (),
    every_key: bool = True,
) -> list[Any]:
    """:func:`encode_beat` by field names, for tests, tools and benchmarks. ``fields``: the
    dynamic fields to write (names of :data:`BEAT_FIELDS`; with ``event``, done, total and
    stage are expected); ``landed``: by default ``seq - 1`` (the beat before this one landed);
    0 for a beat that carries every field (no check); ``every_key``: as for
    :func:`encode_beat` (False: the worker's regular beat, its keys picked by
    :func:`beat_keys`)."""
    unknown = set(fields) - set(BEAT_FIELDS)
    if unknown:
        raise ValueError(f"unknown beat field(s): {', '.join(sorted(unknown))}")
    present = [i for i, name in enumerate(BEAT_FIELDS) if name in fields]
    values = [fields[BEAT_FIELDS[i]] for i in present]
    landed = seq - 1 if landed is None else landed
    head = (token, fence, ttl_ms)
    return encode_beat(head, seq, landed, present, values, event, pairs, True, every_key)


def beat_command(beats: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list[Any]:
    """The ``EVALSHA`` of a batch of beats: ``(keys, segment)`` per job, the keys those the
    segment sends (:func:`beat_keys`: in ``JobKeys.beat()``'s order; on a cluster, all of one
    hash slot)."""
    keys: list[Any] = []
    args: list[Any] = []
    for job_keys, segment in beats:
        keys += job_keys
        args += segment
    return ["EVALSHA", SCRIPTS.beat.sha, len(keys), *keys, *args]


def beat(keys: tuple[str, ...], segment: Sequence[Any]) -> Call[BeatReply]:
    """The beat of one job (a batch of one): ``keys`` those of ``JobKeys.all()``, ``segment``
    from :func:`beat_segment`. A command error of the job is raised."""

    def one(reply: Any) -> BeatReply:
        (answer,) = decode_beats(reply)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return Call(SCRIPTS.beat, *_beat_batch([(keys, segment)]), one)


def beats(
    batch: Sequence[tuple[Sequence[Any], Sequence[Any]]],
) -> Call[list[BeatReply | Exception]]:
    """The beats of several jobs in one call (``(keys, segment)`` per job, the keys those of
    ``JobKeys.all()``: each job sends those its segment names, see :func:`beat_keys`)."""
    keys, args = _beat_batch(batch)
    return Call(SCRIPTS.beat, keys, args, decode_beats)


def _beat_batch(
    batch: Sequence[tuple[Sequence[Any], Sequence[Any]]],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """One batch's keys and arguments, from each job's ``JobKeys.all()`` and segment."""
    keys: list[Any] = []
    args: list[Any] = []
    for (state, events, alive, fence), segment in batch:
        keys += beat_keys((state, alive, events, fence), segment)
        args += segment
    return tuple(keys), tuple(args)


def _decode_acquire(reply: Any) -> AcquireReply:
    code = AcquireCode(int(reply[0]))
    if code is not AcquireCode.STARTED:
        return AcquireReply(code)
    fence, attempt, seq = int(reply[1]), int(reply[2]), int(reply[3])
    return AcquireReply(code, fence, attempt, seq, text(reply[4]), int(reply[5]))


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One script call, not yet sent."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    decode: Callable[[Any], R]

    def command(self) -> tuple[Any, ...]:
        """The ``EVALSHA`` command (``execute_command`` form: redis-py refuses
        ``pipe.evalsha()`` on cluster pipelines; EVALSHA is routed by its keys all the same)."""
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)

    def reload(self) -> tuple[Any, ...]:
        """The command that loads the script after a NOSCRIPT."""
        return ("SCRIPT", "LOAD", self.script.text)


class _Async(Protocol):
    async def execute_command(self, *args: Any, **options: Any) -> Any: ...
    async def script_load(self, script: str) -> Any: ...


class _Sync(Protocol):
    def execute_command(self, *args: Any, **options: Any) -> Any: ...
    def script_load(self, script: str) -> Any: ...


async def _send(redis: _Async, command: Sequence[Any]) -> Any:
    """One command; on an asyncio cluster through ``cluster.execute`` (it follows ASK on one
    connection)."""
    if is_async_cluster(redis):
        (reply,) = await execute(redis, [command])  # type: ignore[arg-type]
        if isinstance(reply, Exception):
            raise reply
        return reply
    return await redis.execute_command(*command)


async def run(redis: _Async, call: Call[R]) -> R:
    """Send ``call`` on an asyncio client, timed as the client's :class:`ScriptClock` says;
    after a NOSCRIPT load the script and send again, after a refused ``TIME`` (auto mode)
    switch the client to argument time and send again (the refused call wrote nothing)."""
    clock = clock_of(redis)
    for _ in range(3):
        await clock.sample(redis)
        try:
            return call.decode(await _send(redis, clock.stamp(call.command())))
        except Exception as exc:
            if is_noscript(exc):
                await redis.script_load(clock.script(call.script).text)
            elif not clock.refused(exc):
                raise
    return call.decode(await _send(redis, clock.stamp(call.command())))


def run_sync(redis: _Sync, call: Call[R]) -> R:
    """Send ``call`` on a blocking client: :func:`run`'s twin."""
    clock = clock_of(redis)
    for _ in range(3):
        clock.sample_sync(redis)
        try:
            return call.decode(redis.execute_command(*clock.stamp(call.command())))
        except Exception as exc:
            if is_noscript(exc):
                redis.script_load(clock.script(call.script).text)
            elif not clock.refused(exc):
                raise
    return call.decode(redis.execute_command(*clock.stamp(call.command())))


def scripts_to_load(results: Iterable[object], scripts: Sequence[Script]) -> list[Script]:
    """The scripts to load after a pipeline: all of ``scripts`` when any result is a NOSCRIPT
    (a restart or SCRIPT FLUSH drops every script at once), else none."""
    if any(isinstance(r, Exception) and is_noscript(r) for r in results):
        return list(scripts)
    return []


# -- the calls ------------------------------------------------------------------------------------


def enroll(shard: str, job_id: str, horizon_ms: int) -> Call[int]:
    """Write the job's running-index entry; returns the deadline now held (server ms)."""
    return Call(SCRIPTS.enroll, (shard,), (job_id, horizon_ms), int)


def acquire(
    keys: tuple[str, ...],
    *,
    token: str,
    ttl_ms: int,
    maxlen: int,
    worker: str,
    total: str = "",
    meta: str = "",
    details: str = "",
    kind: str = "",
    latest: int | str = "",
) -> Call[AcquireReply]:
    """Take the lease (``acquire.lua``): ``total`` and ``meta`` encoded (``""``: none),
    ``details`` the start entry's JSON, ``latest`` the latest start in server ms (``""``: no
    limit). ``token`` is the first field of ``alive``'s value
    (``<token>:<fence>:<seq>:<cancel>``), so it must be non-empty and hold no ``:``.

    Raises:
        ValueError: a token that would not split back out of ``alive``'s value.
    """
    if not isinstance(token, str) or not token or ":" in token:
        raise ValueError(f"an owner token is a non-empty str without ':', got {token!r}")
    args = (token, ttl_ms, maxlen, worker, total, meta, details, kind, latest)
    return Call(SCRIPTS.acquire, keys, args, _decode_acquire)


def finish(
    keys: tuple[str, ...],
    *,
    token: str,
    fence: int,
    ttl_ms: int,
    seq: int,
    status: str,
    error: str,
    maxlen: int,
    retention_ms: int,
    dynamic: Sequence[str],
    details: str = "",
    pairs: Sequence[Any] = (),
) -> Call[FinishCode]:
    """The final write (``finish.lua``): ``dynamic`` the values of :data:`BEAT_FIELDS`, all of
    them, in order; ``pairs`` static field, value pairs."""
    if len(dynamic) != len(BEAT_FIELDS):
        raise ValueError(f"finish needs all {len(BEAT_FIELDS)} dynamic fields")
    args = (token, fence, ttl_ms, seq, status, error, maxlen, retention_ms, details)
    return Call(SCRIPTS.finish, keys, (*args, *dynamic, *pairs), _decode_finish)


def _decode_finish(reply: Any) -> FinishCode:
    return FinishCode(int(reply[0]))


def unindex(key: str, pairs: Sequence[Any]) -> Call[int]:
    """Remove ``member, score`` pairs still scored at most ``score``; returns how many."""
    return Call(SCRIPTS.unindex, (key,), tuple(pairs), int)


def cancel(keys: tuple[str, ...], maxlen: int, details: str) -> Call[CancelCode]:
    """Request a running job's cancel."""
    return Call(SCRIPTS.cancel, keys, (maxlen, details), lambda r: CancelCode(int(r)))


def ack(keys: tuple[str, ...], fence: int) -> Call[bool]:
    """Acknowledge a claim; True when acknowledged (now or by an earlier call)."""
    return Call(SCRIPTS.ack, keys, (fence,), lambda r: int(r) == 1)


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """``claim.lua``'s reply: ``fence``, ``claimed_ms`` and the ``snapshot`` as it was before the
    claim when CLAIMED; ``wait_ms`` (how long the job is not claimable) when ALIVE."""

    code: ClaimCode
    fence: int = 0
    claimed_ms: int = 0
    snapshot: dict[str, str] = field(default_factory=dict)
    wait_ms: int = 0


def _decode_claim(reply: Any) -> ClaimReply:
    code = ClaimCode(int(reply[0]))
    if code is ClaimCode.CLAIMED:
        flat = [text(x) for x in reply[3:]]
        snapshot = dict(zip(flat[::2], flat[1::2], strict=True))
        return ClaimReply(code, int(reply[1]), int(reply[2]), snapshot)
    if code is ClaimCode.ALIVE:
        return ClaimReply(code, wait_ms=int(reply[1]) if len(reply) > 1 else 0)
    return ClaimReply(code)


def claim(
    keys: tuple[str, ...],
    *,
    maxlen: int,
    retention_ms: int,
    error: str,
    redeliver_ms: int,
    token: str,
) -> Call[ClaimReply]:
    """Claim a stale job (``claim.lua``): ``error`` the LOST snapshot's error text, ``token``
    the sweep call's claim token (a replay of the call is answered with its claim)."""
    args = (maxlen, retention_ms, error, redeliver_ms, token)
    return Call(SCRIPTS.claim, keys, args, _decode_claim)


def tally(stats: str, claims_seen: str, args: Sequence[Any] = ()) -> Call[int]:
    """Count claims (``args``: kind, claim pairs); answers the server clock (ms), marking
    "a sweeper ran now"."""
    return Call(SCRIPTS.tally, (stats, claims_seen), tuple(args), int)
