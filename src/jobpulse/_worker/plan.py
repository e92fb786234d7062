"""When each job beats next: the heap both tickers (asyncio and thread) plan with. Pure.

Beats of jobs due within a tenth of their interval are taken together (``COALESCE``), so jobs
started at scattered times share a few pipelines per interval; a take costs
O(due · log n), never a scan of every job.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .._protocol import calls, wire
from .._protocol.calls import BeatReply
from .._protocol.clock import ScriptClock, refuses_time
from .._protocol.errors import is_noscript
from .._protocol.scripts import SCRIPTS, Script
from ..errors import LeaseLostCause
from .machine import BeatMachine
from .sampling import ProcessSample

__all__ = [
    "BATCH",
    "CHUNK",
    "COALESCE",
    "BeatPlan",
    "Beating",
    "Settled",
    "beat_calls",
    "beat_commands",
    "pack_beats",
    "settle_beats",
]

COALESCE = 0.1
"""A beat may go out this fraction of its interval early, to share a pipeline."""
CHUNK = 256
"""Beats per pipeline."""
BATCH = 64
"""Beats per ``beat.lua`` call (a pipeline carries ``CHUNK / BATCH`` calls on one server; on a
cluster a call only carries jobs of one hash slot)."""


class Beating(Protocol):
    """What a ticker needs of a job (the narrow interface of both shells' heartbeats)."""

    @property
    def machine(self) -> BeatMachine[Any]: ...

    def beat(self, now: float, lag: float, sample: ProcessSample) -> list[Any]:
        """Build the next beat, the job's segment of a ``beat.lua`` call (the machine reads
        the job's progress)."""
        ...

    def beat_replied(self, sent_at: float, reply: BeatReply) -> None: ...

    def beat_failed(
        self, sent_at: float, exc: BaseException, *, quiet: bool, at_once: bool
    ) -> None: ...

    def crashed(self, exc: BaseException) -> None: ...

    def lease_expired(self, cause: LeaseLostCause) -> None:
        """The lease's local deadline passed (the machine already recorded the loss)."""
        ...


J = TypeVar("J", bound=Beating)


class BeatPlan(Generic[J]):
    """The registered jobs and a heap of their next beats.

    A job may have stale heap entries; only the one equal to its planned time counts.
    Invariant: every registered job not in flight has a live entry.
    """

    def __init__(self) -> None:
        self.jobs: dict[int, J] = {}
        self._heap: list[tuple[float, int, J]] = []
        self._planned: dict[int, float] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: J) -> bool:
        """Register ``job`` and plan it; True when it is due before everything planned."""
        self.jobs[id(job)] = job
        return self.schedule(job)

    def remove(self, job: J) -> None:
        """Forget ``job``; its heap entries are dropped when they surface."""
        self.jobs.pop(id(job), None)
        self._planned.pop(id(job), None)

    def schedule(self, job: J) -> bool:
        """Plan ``job``'s next beat at ``job.machine.due``; True when that is the earliest."""
        if self.jobs.get(id(job)) is not job:
            return False
        when = job.machine.due
        self._planned[id(job)] = when
        earliest = not self._heap or when < self._heap[0][0]
        heapq.heappush(self._heap, (when, next(self._order), job))
        return earliest

    def first(self) -> float:
        """When the first planned beat is due (``inf``: none)."""
        return self._heap[0][0] if self._heap else math.inf

    def take_due(self, now: float) -> list[J]:
        """Pop the jobs due now and those due within ``COALESCE`` of their interval."""
        due: list[J] = []
        heap = self._heap
        while heap and heap[0][0] - COALESCE * heap[0][2].machine.cfg.interval <= now:
            when, _, job = heapq.heappop(heap)
            live = self.jobs.get(id(job)) is job and self._planned.get(id(job)) == when
            if live and job.machine.ready:
                due.append(job)
        return due

    def index_refresh(
        self, jobs: list[J], server_now: Callable[[], float] | None
    ) -> dict[str, dict[str, int]]:
        """ZADD members for the jobs whose index entry is due, grouped by key (``server_now``:
        the server's clock in seconds, None while unknown: no refresh yet)."""
        out: dict[str, dict[str, int]] = {}
        if server_now is None:
            return out
        for job in jobs:
            if job.machine.index_due():
                for key, member, score in job.machine.index_members(server_now()):
                    out.setdefault(key, {})[member] = score
        return out


def beat_calls(
    beats: Sequence[tuple[J, list[Any]]], slot: Callable[[bytes], int] | None
) -> list[tuple[list[J], list[Any]]]:
    """Group built beats into ``beat.lua`` calls of up to ``BATCH`` jobs: ``(jobs, command)``
    per call. ``slot``: the cluster client's key-slot function (None for one server): then a
    call only carries jobs whose keys share a hash slot (most often a batch of one)."""
    groups: dict[int, list[tuple[J, list[Any]]]] = {}
    for job, segment in beats:
        group = 0 if slot is None else slot(job.machine.beat_keys[0])
        groups.setdefault(group, []).append((job, segment))
    out: list[tuple[list[J], list[Any]]] = []
    for members in groups.values():
        for first in range(0, len(members), BATCH):
            part = members[first : first + BATCH]
            command = calls.beat_command([(job.machine.beat_keys, seg) for job, seg in part])
            out.append(([job for job, _ in part], command))
    return out


def pack_beats(
    batches: Sequence[tuple[Sequence[J], Sequence[Any]]],
    index: dict[str, dict[str, int]],
    clock: ScriptClock,
) -> bytes:
    """One write of a tick's ``beat.lua`` calls (as :func:`beat_calls` built them, stamped by
    ``clock``) and one ``ZADD key GT`` per ``index`` key, for a plain client
    (:func:`~jobpulse._protocol.wire.exchange`): the bytes redis-py's pipeline would write for
    the same commands, in the same order, each packed whole by
    :func:`~jobpulse._protocol.wire.pack` (hiredis's packer)."""
    return b"".join([wire.pack(command) for command in beat_commands(batches, index, clock)])


def beat_commands(
    batches: Sequence[tuple[Sequence[J], Sequence[Any]]],
    index: dict[str, dict[str, int]],
    clock: ScriptClock,
) -> list[Sequence[Any]]:
    """The commands :func:`pack_beats` packs for a plain client, in the same order, as
    argument lists for redis-py's pipeline (a ``single_connection_client``, the blocking
    cluster client) or ``cluster.pipelined`` (the asyncio cluster client); no I/O."""
    commands: list[Sequence[Any]] = [clock.stamp(command) for _jobs, command in batches]
    # ZADD GT: a deadline never moves back
    commands += [wire.zadd(key, members, "GT") for key, members in index.items()]
    return commands


@dataclass(slots=True)
class Settled:
    """What a settled pipeline asks of its ticker."""

    load: list[Script]  # scripts to load (a NOSCRIPT came back)
    server_ms: int | None  # the server's clock in a reply (ms), for index deadlines
    index_failure: BaseException | None  # an index refresh failed (logged; the next retries)


def settle_beats(
    batches: Sequence[Sequence[Beating]],
    results: Sequence[Any],
    index: dict[str, dict[str, int]],
    sent_at: float,
    clock: ScriptClock,
) -> Settled:
    """Hand each job its beat's reply (or error) from a pipeline of ``len(batches)``
    ``beat.lua`` calls (the jobs of each, as :func:`beat_calls` grouped them) followed by one
    ZADD per ``index`` key. Both tickers call it; it does no I/O. A call refused ``TIME`` (in
    ``clock``'s auto mode) switches ``clock`` to argument time and its beats are sent again at
    once, as after a NOSCRIPT (the refused script wrote nothing)."""
    settled = Settled([], None, None)
    refreshed: set[str] = set()
    for key, result in zip(index, results[len(batches) :], strict=True):
        if isinstance(result, Exception):
            settled.index_failure = result
        else:
            refreshed.add(key)
    for jobs in batches if refreshed else ():  # what a job's conditional unindex may remove
        for job in jobs:
            m = job.machine
            if m.index_shard in refreshed:
                m.index_read(index[m.index_shard].get(m.job_id))
    for jobs, result in zip(batches, results, strict=False):
        if isinstance(result, Exception):
            missing = is_noscript(result)
            again = missing or clock.refused(result) or (refuses_time(result) and clock.arguments)
            for job in jobs:
                job.beat_failed(sent_at, result, quiet=again, at_once=again)
            if missing:
                settled.load = [clock.script(SCRIPTS.beat)]
            continue
        for job, answer in zip(jobs, calls.decode_beats(result), strict=True):
            if isinstance(answer, Exception):  # a command failed for this job alone
                job.beat_failed(sent_at, answer, quiet=False, at_once=False)
                continue
            job.beat_replied(sent_at, answer)
            if answer.now_ms > 0:  # a refused beat carries no server time
                settled.server_ms = answer.now_ms
    return settled
