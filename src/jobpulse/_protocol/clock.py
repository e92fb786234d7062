"""Where the scripts' time comes from, per client: the server's ``TIME`` inside each script (the
default), or an argument the client appends (for servers that refuse ``TIME`` in scripts).

One :class:`ScriptClock` per Redis client object (:func:`clock_of`; set it up with
:func:`jobpulse.script_time`). In ``"auto"`` mode (the default) it starts in server mode and
switches to argument mode the first time a script is refused ``TIME`` (``clock.lua`` reads it
first, so a refused call wrote nothing and is sent again). In argument mode the client stamps each
timed script call with its estimate of the server's clock (:meth:`ScriptClock.stamp`):

* from a ``TIME`` reply sent OUTSIDE scripts (``time_command``: ``"TIME"``, or the name a server
  renamed it to): ``server = local_monotonic + offset``, sampled at most every
  :data:`RESAMPLE` seconds; its error bound is half the sample's round trip plus the local
  clock's drift since (:attr:`ScriptClock.bound`);
* when that command is refused too (or ``time_command=None``): the local wall clock, whose error
  is the host's offset from the server's clock (NTP keeps it within milliseconds;
  :attr:`ScriptClock.bound` is then None: unknown).

Leases, liveness and the fence do not depend on the stamped time (TTLs are relative, ``PX``); it
feeds the snapshot's times (``heartbeat_ms``, ``progress_ms``…), stream ``ts_ms`` and the
running-index deadlines, which keep a margin for skew (``acquire.lua``'s latest start).

Default mode costs nothing per beat: :meth:`ScriptClock.stamp` returns the command unchanged.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .clients import AsyncClient, SyncClient
from .codec import text as _text
from .errors import error_code, refuses_time
from .scripts import SCRIPTS, Script

__all__ = [
    "DRIFT",
    "RESAMPLE",
    "ClockMode",
    "ScriptClock",
    "clock_of",
    "known_clock",
    "refuses_time",
    "script_time",
    "set_clock",
]

ClockMode = Literal["auto", "server", "argument"]
RESAMPLE = 30.0
"""Seconds between two ``TIME`` samples in argument mode."""
DRIFT = 1e-4
"""The local clock's drift assumed against the server's (100 ppm: a cheap crystal, no NTP)."""

_MODES = ("auto", "server", "argument")
_BY_SHA: dict[str, Script] = {
    s.sha: s.argument for s in (getattr(SCRIPTS, n) for n in SCRIPTS.__slots__) if s.argument
}
_CLOCKS: weakref.WeakKeyDictionary[Any, ScriptClock] = weakref.WeakKeyDictionary()
_CREATE = threading.Lock()


class ScriptClock:
    """The scripts' time source of one Redis client (see the module docstring).

    Args:
        mode: ``"auto"`` (server time until a script is refused ``TIME``), ``"server"``
            (always; a refusal is an error) or ``"argument"`` (always stamp).
        time_command: the command answering the server's time outside scripts, or None to use
            the local wall clock.
        monotonic: the local monotonic clock (a seam for tests).
        wall: the local wall clock (a seam for tests).

    Attributes:
        mode: the mode asked for.
        time_command: the command sampled for the server's time, or None.
        arguments: True while scripts get the time as an argument (``"argument"`` mode, or
            ``"auto"`` after a refusal).
    """

    def __init__(
        self,
        *,
        mode: ClockMode = "auto",
        time_command: str | None = "TIME",
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
        if time_command is not None and (not isinstance(time_command, str) or not time_command):
            raise ValueError("time_command must be a non-empty str or None")
        self.mode: ClockMode = mode
        self.time_command = time_command
        self._monotonic = monotonic
        self._wall = wall
        self.arguments = mode == "argument"
        self._offset: float | None = None  # server clock (s) minus our monotonic clock
        self._error = 0.0  # half the round trip of the sample
        self._sampled = -float("inf")

    def __repr__(self) -> str:
        bound = self.bound
        shown = "unknown" if bound is None else f"{bound * 1000:.1f}ms"
        return f"<ScriptClock mode={self.mode} arguments={self.arguments} bound={shown}>"

    # -- the mode -----------------------------------------------------------------------------

    def refused(self, exc: BaseException) -> bool:
        """Take a failed script call: True when it was a ``TIME`` refusal and the clock now
        stamps (send the call again); False when ``exc`` is something else, or the mode is
        ``"server"`` (the caller raises it)."""
        if self.mode != "auto" or not refuses_time(exc):
            return False
        self.arguments = True
        return True

    @property
    def bound(self) -> float | None:
        """The error bound (s) of the stamped time: half the sample's round trip plus drift;
        0 in server mode; None when the local wall clock stands in (unknown)."""
        if not self.arguments:
            return 0.0
        if self._offset is None:
            return None
        return self._error + DRIFT * max(0.0, self._monotonic() - self._sampled)

    # -- sampling -----------------------------------------------------------------------------

    def due(self) -> bool:
        """True when argument mode needs a (new) ``TIME`` sample before stamping."""
        if not self.arguments or self.time_command is None:
            return False
        return self._monotonic() - self._sampled >= RESAMPLE

    def sampled(self, reply: Any, sent: float, received: float) -> None:
        """Take a ``TIME`` reply sent at ``sent`` and answered at ``received`` (monotonic s);
        ``reply`` an exception when the command failed (then the wall clock stands in)."""
        self._sampled = received
        if isinstance(reply, BaseException):
            self._offset = None
            return
        seconds, micros = (int(x) for x in reply[:2])
        middle = (sent + received) / 2
        self._offset = seconds + micros / 1e6 - middle
        self._error = (received - sent) / 2

    async def sample(self, redis: Any) -> None:
        """Sample the server's clock if due (asyncio client)."""
        if not self.due():
            return
        sent = self._monotonic()
        try:
            reply: Any = await redis.execute_command(self.time_command)
        except Exception as exc:
            if error_code(exc) is None:  # a fault, not a refusal: keep the old sample
                raise
            reply = exc
        self.sampled(reply, sent, self._monotonic())

    def sample_sync(self, redis: Any) -> None:
        """Sample the server's clock if due (blocking client)."""
        if not self.due():
            return
        sent = self._monotonic()
        try:
            reply: Any = redis.execute_command(self.time_command)
        except Exception as exc:
            if error_code(exc) is None:
                raise
            reply = exc
        self.sampled(reply, sent, self._monotonic())

    # -- stamping -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The estimated server time (ms)."""
        if self._offset is None:
            return int(self._wall() * 1000)
        return int((self._monotonic() + self._offset) * 1000)

    def stamp(self, command: Sequence[Any]) -> Sequence[Any]:
        """An ``EVALSHA`` command as this clock sends it: unchanged in server mode (and for a
        script that reads no time); else with the argument variant's SHA and the time last."""
        if not self.arguments:
            return command
        variant = _BY_SHA.get(_text(command[1]))
        if variant is None:
            return command
        return [command[0], variant.sha, *command[2:], self.now_ms()]

    def script(self, script: Script) -> Script:
        """The variant of ``script`` this clock sends (what to load after a NOSCRIPT)."""
        if self.arguments and script.argument is not None:
            return script.argument
        return script


def clock_of(redis: Any) -> ScriptClock:
    """The :class:`ScriptClock` of the client ``redis`` (an ``"auto"`` one on first use)."""
    clock = _CLOCKS.get(redis)
    if clock is None:
        with _CREATE:  # threads (the sync shell) may meet a new client at once: one clock
            clock = _CLOCKS.get(redis)
            if clock is None:
                clock = _CLOCKS[redis] = ScriptClock()
    return clock


def known_clock(redis: Any) -> ScriptClock | None:
    """The clock given to ``redis`` so far, if any (never creates one)."""
    return _CLOCKS.get(redis)


def set_clock(redis: Any, clock: ScriptClock) -> ScriptClock:
    """Give the client ``redis`` its clock (replacing any)."""
    with _CREATE:
        _CLOCKS[redis] = clock
    return clock


def script_time(
    client: AsyncClient | SyncClient,
    *,
    mode: ClockMode = "auto",
    time_command: str | None = "TIME",
) -> ScriptClock:
    """Choose where the time of jobpulse's scripts comes from, for every use of ``client``.

    By default (``mode="auto"``) scripts read the server's ``TIME``; on a server that refuses
    ``TIME`` in scripts (ElastiCache Serverless is reported to; a ``rename-command TIME``) the
    first refused call switches ``client`` to *argument time*: each script then takes the time
    as its last argument, estimated by the client from ``time_command`` sent outside scripts
    (error: half its round trip, resampled every 30 s), or from the local wall clock when that
    is refused too. Call this before the client's first job to force a mode or to name a
    renamed ``TIME``. Works for asyncio and blocking clients (also Cluster and Sentinel ones).

    Args:
        client: a ``redis.asyncio.Redis``, ``redis.Redis`` or a Cluster client.
        mode: ``"auto"``, ``"server"`` (always ``TIME`` in scripts; a refusal is raised) or
            ``"argument"`` (always the time as an argument).
        time_command: the server's ``TIME`` command as the client may send it (its new name
            after a ``rename-command``), or None to use the local wall clock (its error is the
            host's offset from the server's clock).

    Returns:
        The client's :class:`ScriptClock` (its ``arguments`` and ``bound`` tell the mode in
        force and the error bound of the time it sends).

    Raises:
        ValueError: ``mode`` or ``time_command`` is not one of the above.
    """
    return set_clock(client, ScriptClock(mode=mode, time_command=time_command))
