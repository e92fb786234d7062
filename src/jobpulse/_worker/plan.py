"""When each job beats next: the heap both tickers (asyncio and thread) plan with, and who may
use a client's connections (:class:`SendGate`). Pure.

Beats of jobs due within a tenth of their interval are taken together (``COALESCE``), so jobs
started at scattered times share a few pipelines per interval; a take costs
O(due · log n), never a scan of every job.

Overload degrades the beat rate, never the leases: due beats are served in the order of their
lease deadlines (the job closest to losing its lease first), beats take a free connection
before any other call, and new jobs start entering ``ENTERING`` at a time, one at a time while
a running job's lease presses (:meth:`BeatPlan.pressing`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
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
    "ENTERING",
    "PRESSING",
    "BeatPlan",
    "Beating",
    "SendGate",
    "Settled",
    "beat_calls",
    "beat_commands",
    "chunk_budget",
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
PRESSING = 0.5
"""A due beat presses when less than this fraction of its ttl is left of its lease (with the
defaults, a beat 2 s late): new jobs then enter one at a time, not ``ENTERING``."""
ENTERING = 32
"""Jobs entering (index, lease, kind index) at once per client: a burst of new jobs queues
here, before anything is written or any timeout starts, not on the connections beats need."""


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
    """The registered jobs, a heap of their next beats by due time, and a heap of the due ones
    by lease deadline (what a take serves first when the ticker cannot keep up).

    A job may have stale entries in both heaps; only one made at its planned time counts.
    Invariant: every registered job not in flight has a live entry in one of the two heaps.
    A job's lease deadline does not move while it waits in the due heap (only a beat's reply
    renews it, and a waiting job has none in flight).
    """

    def __init__(self) -> None:
        self.jobs: dict[int, J] = {}
        self._heap: list[tuple[float, int, J]] = []
        # the due jobs: (lease deadline, planned time, order, job)
        self._due: list[tuple[float, float, int, J]] = []
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
        """When the first planned beat is due (``inf``: none; a past time: one is waiting)."""
        self._drop_stale()
        if self._due:
            return -math.inf
        return self._heap[0][0] if self._heap else math.inf

    def take_due(self, now: float, limit: int | None = None) -> list[J]:
        """Pop the jobs due now and those due within ``COALESCE`` of their interval, at most
        ``limit`` of them, in the order of their lease deadlines; the others stay due."""
        self._move_due(now)
        due: list[J] = []
        heap = self._due
        while heap and (limit is None or len(due) < limit):
            _, when, _, job = heapq.heappop(heap)
            if self._live(job, when):
                del self._planned[id(job)]  # taken: any other entry of this plan is stale
                due.append(job)
        return due

    def has_due(self, now: float) -> bool:
        """A beat is due now (or within ``COALESCE`` of its interval): a take finds it."""
        self._move_due(now)
        self._drop_stale()
        return bool(self._due)

    def pressing(self, now: float) -> bool:
        """A due beat waits whose lease has less than ``PRESSING`` of its ttl left: new jobs
        must wait before they enter (:class:`SendGate`), the connections go to beats."""
        self._move_due(now)
        self._drop_stale()
        if not self._due:
            return False
        deadline, _, _, job = self._due[0]
        return deadline - now < PRESSING * job.machine.cfg.ttl

    @staticmethod
    def lateness(jobs: Sequence[J], now: float) -> float:
        """How late the earliest of ``jobs``' beats goes out at ``now`` (0: none late): the
        lateness a beat reports (``loop_lag_ms``) when the ticker cannot keep up."""
        return max(0.0, now - min((job.machine.due for job in jobs), default=now))

    def _live(self, job: J, when: float) -> bool:
        key = id(job)
        live = self.jobs.get(key) is job and self._planned.get(key) == when
        return live and job.machine.ready

    def _move_due(self, now: float) -> None:
        heap, due, pop, push = self._heap, self._due, heapq.heappop, heapq.heappush
        while heap:
            when, order, job = heap[0]
            machine = job.machine
            if when - COALESCE * machine.cfg.interval > now:
                return
            pop(heap)
            if self._live(job, when):
                push(due, (machine.lease.deadline, when, order, job))

    def _drop_stale(self) -> None:
        heap = self._due
        while heap and not self._live(heap[0][3], heap[0][1]):
            heapq.heappop(heap)

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


W = TypeVar("W")


class SendGate(Generic[W]):
    """Who may use one client's ``slots`` connections next, and which new job may start
    entering. Waiters are opaque handles (a shell's futures) that the shell wakes when a
    method hands them back; a handed slot or admission passes to that waiter.

    Slots: a beat pipeline takes a free one before any other call (an acquire step, a final
    write); a freed slot goes to the first waiting beat, else the first other waiter.
    Admission: a new job starts entering while fewer than ``entering`` jobs are entering, or
    while none is when a lease presses (:meth:`BeatPlan.pressing`: the beats come first, but
    a burst still finishes starting), in the order the jobs came.
    """

    def __init__(self, slots: int, entering: int = ENTERING) -> None:
        if slots < 1 or entering < 1:
            raise ValueError("a gate needs at least one slot and one entering job")
        self.free = slots
        self.entering = 0
        self._limit = entering
        self._beats: deque[W] = deque()
        self._others: deque[W] = deque()
        self._entrants: deque[W] = deque()

    def take(self, waiter: W, *, beat: bool) -> bool:
        """``waiter`` wants a slot: True when it has one now, else it waits its turn."""
        if self.free > 0 and not self._beats and (beat or not self._others):
            self.free -= 1
            return True
        (self._beats if beat else self._others).append(waiter)
        return False

    def give_back(self) -> W | None:
        """A slot was freed: the waiter it passes to (wake it), or None (it is free)."""
        if self._beats:
            return self._beats.popleft()
        if self._others:
            return self._others.popleft()
        self.free += 1
        return None

    def enter(self, waiter: W, *, pressing: bool) -> bool:
        """A new job wants to enter: True when it may now, else it waits its turn."""
        if not self._entrants and self.entering < self._room(pressing):
            self.entering += 1
            return True
        self._entrants.append(waiter)
        return False

    def admit(self, *, pressing: bool) -> list[W]:
        """The waiting jobs that may enter now (wake them; each counts as entering)."""
        out: list[W] = []
        while self._entrants and self.entering < self._room(pressing):
            out.append(self._entrants.popleft())
            self.entering += 1
        return out

    def _room(self, pressing: bool) -> int:
        return 1 if pressing else self._limit

    def entered(self) -> None:
        """A job admitted by :meth:`enter` or :meth:`admit` finished entering (or gave up)."""
        self.entering -= 1

    def forget(self, waiter: W) -> None:
        """``waiter`` stopped waiting (cancelled) before it was handed anything."""
        for queue in (self._beats, self._others, self._entrants):
            if waiter in queue:
                queue.remove(waiter)
                return

    @property
    def waiting(self) -> int:
        """New jobs waiting to enter."""
        return len(self._entrants)


def chunk_budget(lefts: Sequence[float], intervals: Sequence[float]) -> float:
    """Seconds a chunk's beats may wait for their reply, from each job's budget (its lease time
    left, ``BeatMachine.beat_budget``) and ``interval``.

    The smallest budget, so a reply that is stuck (a half-open connection, a lost reply) is
    given up while the chunk's other leases still stand, and their beats go again on a fresh
    connection; but never less than one ``interval`` (the largest in the chunk), capped by the
    largest budget: a reply is late only once a new beat would be due, so a loaded Redis that
    answers within an interval is waited for even when the chunk's most pressed job is about to
    expire (its own timer stops that job; the others' replies renew).
    """
    floor = min(max(lefts), max(intervals))
    return max(min(lefts), floor)


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
