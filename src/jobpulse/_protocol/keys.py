"""The one place that spells Redis key names.

Every key of one job carries the job id as a Redis Cluster hash tag (``ns:{job_id}:state``),
so a job's scripts touch a single slot. The running-jobs index is split into ``index_shards``
sorted sets whose hash tags differ from any job's, so a cluster spreads them over its nodes.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from ..errors import InvalidJobId

__all__ = ["AliveValue", "JobKeys", "KeySchema", "alive_value", "check_job_id", "check_namespace"]

_JOB_ID = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")
_NAMESPACE = re.compile(r"[A-Za-z0-9._\-]{1,64}")


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` when it follows the contract's grammar, else raise InvalidJobId."""
    if not isinstance(job_id, str) or _JOB_ID.fullmatch(job_id) is None:
        raise InvalidJobId(
            f"invalid job id {job_id!r}: expected 1 to 200 characters of A-Z a-z 0-9 . _ - : /"
        )
    return job_id


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` when valid (1 to 64 of ``A-Z a-z 0-9 . _ -``), else raise."""
    if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
        raise InvalidJobId(
            f"invalid namespace {namespace!r}: expected 1 to 64 characters of A-Z a-z 0-9 . _ -"
        )
    return namespace


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys of one job, in the order every per-job script takes them as KEYS[1..4].

    ``alive`` is the liveness key and the lease in one (docs/protocol.md): a String whose value
    is :func:`alive_value` (the owner, the snapshot's seq and cancel flag), ``PX ttl``; its
    absence while the snapshot says RUNNING means STALE.
    """

    state: str
    events: str
    alive: str
    fence: str

    def all(self) -> tuple[str, str, str, str]:
        return (self.state, self.events, self.alive, self.fence)

    def beat(self) -> tuple[str, str, str, str]:
        """The keys in ``beat.lua``'s order: state, alive, events, fence. A beat sends all four,
        or only the first two (its regular path), or the first three (with a stream entry)."""
        return (self.state, self.alive, self.events, self.fence)


@dataclass(frozen=True, slots=True)
class AliveValue:
    """The value of a job's ``alive`` key, read back (:meth:`parse`): the lease owner's token
    and fence, the snapshot's ``seq`` and its cancel flag (docs/protocol.md)."""

    token: str
    fence: int
    seq: int
    cancel: bool = False

    @classmethod
    def parse(cls, value: bytes | str) -> AliveValue:
        """Split ``<token>:<fence>:<seq>:<cancel>`` (later fields, if any, are ignored).

        Raises:
            ValueError: the value does not have that layout.
        """
        raw = value.decode() if isinstance(value, bytes) else value
        parts = raw.split(":")
        ok = len(parts) >= 4 and parts[0] and parts[1].isdigit() and parts[2].isdigit()
        if not ok or parts[3] not in ("0", "1"):
            raise ValueError(f"not a jobpulse alive value: {raw!r}")
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3] == "1")


def alive_value(token: str, fence: int, seq: int, cancel: bool = False) -> str:
    """The ``alive`` key's value: ``<token>:<fence>:<seq>:<cancel>`` of the owner ``token``
    holding ``fence``, the snapshot's ``seq`` and its cancel flag (``0`` or ``1``), as
    ``acquire.lua``, ``beat.lua`` and ``cancel.lua`` write it."""
    return f"{token}:{fence}:{seq}:{int(cancel)}"


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Key names for one namespace.

    Args:
        namespace: the key prefix (default ``"jobpulse"``).
        index_shards: how many sorted sets the running-jobs index is split into (1 for a single
            Redis; for a cluster, about the number of masters so the index spreads over them).
    """

    namespace: str = "jobpulse"
    index_shards: int = 1

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        if not isinstance(self.index_shards, int) or not 1 <= self.index_shards <= 1024:
            raise ValueError(f"index_shards must be an int in 1..1024, got {self.index_shards!r}")

    def job(self, job_id: str) -> JobKeys:
        """The keys of ``job_id`` (validated)."""
        p = f"{self.namespace}:{{{check_job_id(job_id)}}}:"
        return JobKeys(p + "state", p + "events", p + "alive", p + "fence")

    def state(self, job_id: str) -> str:
        return self.job(job_id).state

    def events(self, job_id: str) -> str:
        return self.job(job_id).events

    def alive(self, job_id: str) -> str:
        return self.job(job_id).alive

    def index(self, shard: int) -> str:
        """The running-jobs index shard ``shard`` (a sorted set of job ids scored by deadline)."""
        # "#" never appears in a job id, so an index key can never collide with a job's keys.
        return f"{self.namespace}:{{#running:{shard}}}"

    def indexes(self) -> list[str]:
        return [self.index(s) for s in range(self.index_shards)]

    def index_for(self, job_id: str) -> str:
        """The index shard that holds ``job_id``."""
        return self.index(zlib.crc32(job_id.encode()) % self.index_shards)

    def kind_index(self, kind: str) -> str:
        """The per-kind index of ``kind`` (a sorted set of job ids scored by ``started_ms``)."""
        # a kind has the job id's alphabet (no braces, no "#"): one slot per kind
        return f"{self.namespace}:{{#kind:{kind}}}"

    def kinds(self) -> str:
        """The kinds seen (a sorted set of kinds scored by when a worker last indexed one)."""
        return f"{self.namespace}:{{#kinds}}"

    def stats(self) -> str:
        """The sweepers' shared counters (a Hash: ``claims:<kind>``, ``sweep_ms``)."""
        return f"{self.namespace}:{{#stats}}"

    def claims_seen(self) -> str:
        """The claims already counted (a sorted set, same slot as :meth:`stats`)."""
        return f"{self.namespace}:{{#stats}}:claims"
