"""What a sweep does beside its claims: keep the per-kind indexes and the shared counters true.

A claimed job leaves its kind's index (its snapshot names the kind and the attempt's
``started_ms``); a job the claim found ended leaves every kind's index (its kind may be gone
with its snapshot), but only an entry older than the sweep, so an attempt that restarted the
job since is spared. Both go out *before* the running-jobs index entries are dropped: if they
fail, the running entries stay and the next sweep meets the same jobs again, so a kind entry is
never orphaned by a sweeper dying between two steps. The claims are counted by ``tally.lua``,
once per (job, fence), so a replayed call counts nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._protocol import calls
from .._protocol.keys import KeySchema

if TYPE_CHECKING:
    from .sweeper import StaleJob

__all__ = ["MAX_KINDS", "forget_ops"]

MAX_KINDS = 1000
"""Most kinds a sweep walks for jobs that ended unseen (kinds are low-cardinality)."""

Op = Callable[[Any], object]


def forget_ops(
    schema: KeySchema,
    claimed: Iterable[StaleJob],
    ended: list[str],
    kinds: list[str],
    now_ms: int,
) -> list[Op]:
    """The pipelined commands that drop ``claimed`` and ``ended`` jobs from the kind indexes
    and count the claims (``tally.lua``), in that order."""
    by_kind: dict[str, list[str]] = {}
    tally: list[str] = []
    for job in claimed:
        kind = job.snapshot.get("kind", "")
        started = job.snapshot.get("started_ms") or "0"
        by_kind.setdefault(kind, []).extend((job.job_id, started))
        tally += [kind, f"{job.job_id} {job.fence}"]
    if ended:
        # an attempt started after the sweep's clock reading has started_ms >= now_ms
        older = str(now_ms - 1)
        for kind in kinds:
            by_kind.setdefault(kind, []).extend(x for job in ended for x in (job, older))
    ops = [_command(calls.unindex(schema.kind_index(k), v)) for k, v in by_kind.items()]
    if tally:
        ops.append(_command(calls.tally(schema.stats(), schema.claims_seen(), tally)))
    return ops


def _command(call: calls.Call[int]) -> Op:
    return lambda pipe: pipe.execute_command(*call.command())
