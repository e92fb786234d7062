"""The history: one JSON object per line, one file per process, merged by time for the checker.

Every record has ``t`` (``time.monotonic()``), ``wall`` (``time.time()``), ``proc`` (the process's
role and number, e.g. ``worker-2.0``), ``pid`` and ``op``. All the processes of a run are on one
Linux machine, whose ``CLOCK_MONOTONIC`` is system-wide: ``t`` is one clock for all of them, so
records of different processes are ordered by it. ``wall`` is for people only.

Operations (the fields beside the common ones):

* worker: ``acquire`` (job, fence, attempt, shell, t0), ``checkpoint`` (job, fence, n, t0; the
  worker saw it acknowledged), ``final`` (job, fence, status, t0; the final write returned),
  ``lease_lost`` (job, fence, cause), ``job_error`` (job, error), ``gil`` (start, end: the body
  held the GIL from ``start`` to ``end``);
* reader: ``read`` (job, reader, t0, state, fence, seq; ``t`` is when the answer came; an HTTP
  read also ``http``: its status code, and ``given``: the ``[fence, seq]`` of the ETag it sent),
  ``event`` (job, reader ``watch``, t0, kind, id, state, fence, seq, synthetic: one event a
  watch yielded), ``read_error`` (job, reader, error);
* sweeper: ``deliver`` (job, attempt, fence, checkpoint n or None), ``ack`` (job, attempt, fence);
* queue (:mod:`tests.nemesis.celery_actor`): a node's main process ``q_received`` (task: a
  delivery), ``q_ack`` (task), ``q_restore`` (tasks: kombu put a closed channel's deliveries
  back on the queue), ``q_expired`` (task: a node's scan put back a delivery past its
  visibility timeout); a pool child ``exec_start`` / ``exec_end`` (task, node, node_pid,
  outcome ``completed`` or the exception's name), ``no_heartbeat`` (task: jobpulse could not take
  the lease, the body did nothing) and the job's records as a worker's; the producer ``q_send``;
* harness: ``spawn`` (role, child), ``fault`` (kind, target: a pid, ``"redis"`` or ``"net"``,
  start, end; a ``rollback`` also ``saved``: when the RDB it restarted from was taken),
  ``schedule`` (seed, faults), ``end_faults``, ``dump`` (job, state, fence, seq,
  checkpoints: the ``n`` of every checkpoint entry in the job's stream after the run).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


class History:
    """Appends records of one process to ``dir/proc.jsonl`` (one write per record, flushed)."""

    def __init__(self, directory: str | Path, proc: str) -> None:
        self.proc = proc
        self.path = Path(directory, f"{proc}.jsonl")
        self._file = self.path.open("a", buffering=1, encoding="utf-8")

    def add(self, op: str, **fields: Any) -> Record:
        rec: Record = {"t": time.monotonic(), "wall": time.time(), "proc": self.proc,
                       "pid": os.getpid(), "op": op, **fields}  # fmt: skip
        self._file.write(json.dumps(rec) + "\n")
        return rec

    def close(self) -> None:
        self._file.close()


def load(directory: str | Path) -> list[Record]:
    """Every record of every process of a run, in time order (a line cut by a SIGKILL dropped)."""
    out: list[Record] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # the process died in the middle of this write
    return sorted(out, key=lambda r: r["t"])


def dump(records: Iterable[Record]) -> str:
    return "\n".join(json.dumps(r, sort_keys=True) for r in records)
