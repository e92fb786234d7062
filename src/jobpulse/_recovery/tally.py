"""What a sweep does beside its claims: keep the per-kind indexes and the shared counters true.

A claimed job leaves its kind's index (its snapshot names the kind and the attempt's
``started_ms``); a job the claim found ended leaves every kind's index (its kind may be gone
with its snapshot), but only an entry older than the sweep, so an attempt that restarted the
job since is spared. Both go out *before* the running-jobs index entries are dropped: if they
fail, the running entries stay and the next sweep meets the same jobs again, so a kind entry is
never orphaned by a sweeper dying between two steps. The claims are counted by ``tally.lua``,
once per (job, fence), so a replayed call counts nothing twice.

The kinds set (``ns:{#kinds}``, a kind scored by the deadline of its last index write) is pruned:
a kind whose score is older than the sweeper's ``retention`` and whose index is empty leaves it
(:func:`prune_bound`). The removal is one ``ZREMRANGEBYSCORE`` on the kinds key, bounded by the
oldest kind that must stay, so it removes only kinds whose score has not moved since they were
read: a job of that kind starting meanwhile writes a score in the future and is never removed
(and one that starts between the index check and the removal writes its kind again right after).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._protocol import calls
from .._protocol.keys import KeySchema

if TYPE_CHECKING:
    from .sweeper import StaleJob

__all__ = ["MAX_KINDS", "PRUNE_BATCH", "forget_ops", "prune_bound"]

MAX_KINDS = 1000
"""Most kinds a sweep walks for jobs that ended unseen (kinds are low-cardinality)."""

PRUNE_BATCH = 1000
"""Most kinds one prune looks at (the oldest first)."""

Op = tuple[Sequence[Any], Mapping[str, Any]]
"""One pipelined command: its arguments and its ``execute_command`` keyword arguments."""


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
    return call.command(), {}


def prune_bound(
    scored: list[tuple[str, float]], sizes: list[int | None], *, cutoff_ms: int, limit: int
) -> str | None:
    """The ``max`` of ``ZREMRANGEBYSCORE ns:{#kinds} -inf max`` that removes only old kinds with
    an empty index, or None when nothing may go.

    Args:
        scored: the kinds scored ``<= cutoff_ms``, lowest first, as read (at most ``limit``).
        sizes: each one's index size (``ZCARD ns:{#kind:K}``), None when it could not be read.
        cutoff_ms: the prune's cutoff (server ms).
        limit: how many kinds the read asked for.
    """
    for i, ((_, score), size) in enumerate(zip(scored, sizes, strict=True)):
        if size != 0:  # a job is (or may be) indexed: this kind stays, and every later one
            return None if i == 0 else f"({score!r}"
    if not scored:
        return None
    if len(scored) < limit:  # every kind up to the cutoff was read
        return str(cutoff_ms)
    return f"({scored[-1][1]!r}"  # kinds of the last score may lie beyond the read
