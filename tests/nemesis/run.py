"""The harness of a nemesis run: the servers of a topology (:mod:`tests.nemesis.topology`: one
redis-server behind a fault proxy, Sentinel, or Cluster), the actor processes
(:mod:`tests.nemesis.actors`), and a seeded schedule of faults.

The schedule is drawn from ``random.Random(seed)`` before anything starts and depends on nothing
else, so a seed replays the same faults in the same order at the same offsets (the processes'
own timing differs from run to run, as it does on any machine). Faults come one after another,
never two at once; after the last one the run goes on for ``settle`` seconds without faults, so
that every claim can be delivered and acknowledged before the checker looks. The topology is the
seed's (:func:`tests.nemesis.topology.for_seed`) unless one is named; its schedule holds the
process faults and the topology's own server faults only. With ``cover`` the schedule starts with
every kind of the topology once (a seeded order), then draws as usual: a soak's segments use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

import jobpulse.sync
from jobpulse._protocol.keys import KeySchema

from ..support import ROOT
from .checker import Limits, Violation, check, report
from .history import History, Record, load
from .topology import SERVER_KINDS, TOPOLOGIES, Topology, for_seed

NS = "nemesis"
SHOWN = 3  # violations printed in full per rule
TTL = 3.0
INTERVAL = 0.5
# (kind, weight): a fault's kind is drawn with these weights.
KINDS: tuple[tuple[str, int], ...] = (
    ("kill", 4), ("kill_sweeper", 1), ("stop_short", 2), ("stop_long", 2), ("gil", 2),
    ("restart", 1), ("rollback", 1), ("latency", 2), ("cut", 2), ("lost_reply", 2),
    ("blackhole", 1), ("sleep", 1), ("kill_sidecar", 2), ("failover", 3), ("migrate", 3),
    # on a Celery node (tests/nemesis/celery_actor.py; single topology only): SIGKILL of its pool
    # child running a task, of its main process, of the child's sidecar helper; SIGSTOP of the
    # child; a GIL hold in the child
    ("kill_pool", 2), ("kill_celery", 1), ("kill_celery_sidecar", 1), ("stop_celery", 1),
    ("gil_celery", 2),
    # a worker paused until a sweeper claimed its job: resumed, it must be fenced out
    ("stop_claimed", 1),
)  # fmt: skip
CELERY_KINDS = frozenset({"kill_pool", "kill_celery", "kill_celery_sidecar", "stop_celery",
                          "gil_celery"})  # fmt: skip
# kombu has no Redis Cluster transport; a sentinel:// broker is left for later: Celery runs on
CELERY_TOPOLOGIES = frozenset({"single"})
# The time a fault takes beyond its ``seconds`` (kept free in the schedule): a failover's
# detection, election and the old master's resync; a slot move's MIGRATE and SETSLOTs.
EXTRA = {"failover": 6.0, "migrate": 0.5}
# (role, sidecar): beats on the event loop, from the sidecar helper, from the sync shell's
# thread, from the sidecar helper
WORKERS = (("async-worker", False), ("async-worker", True), ("sync-worker", False),
           ("sync-worker", True))  # fmt: skip
SIDECARS = [i for i, (_, sidecar) in enumerate(WORKERS) if sidecar]
SWEEPERS = 2
CELERY_NODES = 2  # prefork, one pool child each: a task restored from one runs on the other
CELERY_EVERY = 2.5  # s between two tasks sent (each 4-8 s long, on 2 children)
REDELIVER_AFTER = 3.0  # the sweepers' (default 60 s): a claim left unacknowledged comes back
GIL_HOLD = 2.5 * TTL  # a worker's body holds the GIL this long on SIGUSR1
INDEX_EVERY = 10  # the default: a dead job's index deadline is at most 10 intervals + ttl ahead
# A sweeper claims a dead job once its index deadline passed: within index_every x interval + ttl
# of its last beat, plus a sweep (0.3 s) and the load of a shared machine.
LIMITS = Limits(ttl=TTL, cache_ttl=0.5, grace=1.0, claim_within=INDEX_EVERY * INTERVAL + 2.0)


def kinds_of(topology: str) -> tuple[tuple[str, int], ...]:
    """The fault kinds (and weights) of a run on ``topology``: the process faults and its own
    server faults."""
    own = TOPOLOGIES[topology].faults
    skip = set() if topology in CELERY_TOPOLOGIES else CELERY_KINDS
    return tuple((k, w) for k, w in KINDS
                 if (k not in SERVER_KINDS or k in own) and k not in skip)  # fmt: skip


def schedule(seed: int, seconds: float, topology: str | None = None,
             cover: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The faults of a run: offset ``at`` (s from the start), ``kind``, ``slot`` (which worker or
    sweeper), ``seconds`` (how long it lasts)."""
    rng = random.Random(seed)
    kinds, weights = zip(*kinds_of(topology or for_seed(seed)), strict=True)
    first = list(kinds) if cover else []
    rng.shuffle(first)
    out: list[dict[str, Any]] = []
    at = 3.0
    settle = settle_time()
    while True:
        kind = first.pop(0) if first else rng.choices(kinds, weights)[0]
        seconds_ = {
            "stop_short": rng.uniform(0.2, 0.4 * TTL),
            "stop_long": rng.uniform(1.5 * TTL, 2.5 * TTL),
            "stop_claimed": rng.uniform(3.5 * TTL, 4.5 * TTL),  # past LIMITS.claim_within + ttl
            "gil": GIL_HOLD,
            "gil_celery": GIL_HOLD,
            "rollback": rng.uniform(0.5, 2.0),
            "latency": rng.uniform(1.0, 4.0),
            "blackhole": rng.uniform(1.5 * TTL, 2 * TTL),
            "sleep": rng.uniform(0.5, 1.5 * TTL),
        }.get(kind, 0.0)
        # (drawn apart: the draws above, for every kind, keep the single topology's schedules)
        if kind == "failover":  # how long the replica misses the master's writes
            seconds_ = rng.uniform(0.5, 3.0)
        elif kind == "migrate":  # how long the slot is held MIGRATING / IMPORTING
            seconds_ = rng.uniform(0.5 * TTL, 1.5 * TTL)
        slot = rng.randrange(SWEEPERS if kind == "kill_sweeper" else len(WORKERS))
        if kind in CELERY_KINDS:
            slot %= CELERY_NODES
        if kind == "stop_celery":
            seconds_ = rng.uniform(0.2, 2.5 * TTL)
        if kind == "kill_sidecar":
            slot = SIDECARS[slot % len(SIDECARS)]
        if kind == "stop_claimed":  # a sidecar helper beats on while its owner is stopped
            slot = [i for i in range(len(WORKERS)) if i not in SIDECARS][slot % 2]
        if at + seconds_ + EXTRA.get(kind, 0.0) > seconds - settle:
            return out
        out.append({"at": round(at, 3), "kind": kind, "slot": slot, "seconds": round(seconds_, 3)})
        at += seconds_ + EXTRA.get(kind, 0.0) + rng.uniform(1.0, 3.0)


def settle_time() -> float:
    """Long enough for the last fault's dead job to be claimed and a claim left unacknowledged
    to be delivered again."""
    return 2 * TTL + LIMITS.claim_within + REDELIVER_AFTER


def _sidecar_of(pid: int) -> int | None:
    """The pid of the sidecar helper process of worker ``pid`` (a child), if it runs."""
    return _child_of(pid, b"sidecar")


def _child_of(pid: int, mark: bytes) -> int | None:
    """The pid of a child of ``pid`` whose command line holds ``mark``, if one runs."""
    return next(iter(_children_of(pid, mark)), None)


# A defect of Celery 5.7 / kombu 5.7 (not of jobpulse): after a Redis restart or rollback while an
# acks_late task runs, the worker's main process logs this while kombu restores the broken
# connection's deliveries, and exits (code 1). The harness restarts such a node, as a supervisor
# (systemd, Kubernetes) would in production, and records its death; any other exit of a node is
# a crash the run fails on (actor-alive).
CELERY_UPSTREAM_EXIT = "object has no attribute 'hostname'"


def _children_of(pid: int, mark: bytes) -> list[int]:
    """The pids of the children of ``pid`` whose command line holds ``mark``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in map(int, children):
        with contextlib.suppress(OSError):
            if mark in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
    return out


@dataclass
class _Actor:
    role: str
    name: str
    conn: dict[str, Any]
    sidecar: bool = False
    generation: int = 0
    proc: subprocess.Popen[str] | None = None


@dataclass
class Harness:
    seed: int
    seconds: float
    dir: Path
    faults: list[dict[str, Any]] = field(default_factory=list)
    topology: str = "single"

    def __post_init__(self) -> None:
        self.topo: Topology = TOPOLOGIES[self.topology]()
        self.hist = History(self.dir, "harness-0")
        self.actors: list[_Actor] = []
        self.injected = 0
        self.skipped = 0  # scheduled but found nothing to hit (a sidecar kill between jobs)
        self.by_kind: dict[str, int] = {}  # faults injected (not skipped), by kind
        self.died: list[str] = []  # actors that exited on their own (a crash: a harness failure)
        self.sessions: list[int] = []  # the process groups of the Celery nodes ever started
        self.children: dict[int, tuple[float, list[int]]] = {}  # node pid -> seen alive, children
        self.restarted: list[str] = []  # Celery nodes restarted after the upstream defect

    # -- processes
    def _spawn(self, actor: _Actor) -> None:
        actor.generation += 1
        cfg = {"dir": str(self.dir), "proc": f"{actor.name}.{actor.generation}",
               "conn": actor.conn, "ns": NS, "ttl": TTL, "interval": INTERVAL, "seed": self.seed,
               "gil": GIL_HOLD, "redeliver_after": REDELIVER_AFTER,
               "sidecar": actor.sidecar, "every": CELERY_EVERY}  # fmt: skip
        module, role, celery = "tests.nemesis.actors", actor.role, actor.role.startswith("celery-")
        if celery:  # in a session of its own: its pool children are killed with it at the end
            module, role = "tests.nemesis.celery_actor", role.removeprefix("celery-")
        # a Celery node's log in a file (read when it exits: which defect ended it)
        err = Path(self.dir, f"{cfg['proc']}.log").open("w") if celery else None  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", module, role, json.dumps(cfg)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=celery,
        )  # fmt: skip
        if err is not None:
            err.close()
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"{actor.role} did not start: {line!r}")
        actor.proc = proc
        if actor.role.startswith("celery-"):
            self.sessions.append(proc.pid)
        self.hist.add("spawn", role=actor.role, name=cfg["proc"], child=proc.pid)

    def _kill(self, actor: _Actor) -> None:
        assert actor.proc is not None
        t = time.monotonic()
        actor.proc.kill()
        actor.proc.wait()
        self.hist.add("fault", kind="kill", target=actor.proc.pid, start=t, end=t)
        self._spawn(actor)

    def _supervise(self) -> None:
        """Restart a Celery node that the upstream defect ended (recorded as its death and its
        pool children's: their runs ended there); note each live node's children."""
        now = time.monotonic()
        for actor in self.actors:
            if actor.role != "celery-worker" or actor.proc is None:
                continue
            pid = actor.proc.pid
            if actor.proc.poll() is None:
                self.children[pid] = (now, _children_of(pid, b"celery_actor"))
                continue
            log_ = Path(self.dir, f"{actor.name}.{actor.generation}.log")
            if CELERY_UPSTREAM_EXIT not in log_.read_text(errors="replace"):
                continue  # a crash: actor-alive names it at the end
            seen, children = self.children.pop(pid, (now, []))
            # When it died: its log's last write (the defect's message, just before the exit),
            # not when it was last seen alive (no tick runs while a fault's duration is slept
            # out: a death recorded that early made its child's later beats look like a dead
            # worker's)
            died = now - (time.time() - log_.stat().st_mtime)
            died = min(max(died, seen), now)
            for target in [pid, *children]:
                self.hist.add("fault", kind="kill", target=target, start=died, end=died,
                              via="exit: Celery/kombu defect after a Redis restart")  # fmt: skip
            self.restarted.append(f"{actor.name}.{actor.generation}")
            if actor.proc.stdout is not None:
                actor.proc.stdout.close()
            self._spawn(actor)

    def _sleep_until(self, when: float) -> None:
        while (left := when - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
            self._supervise()

    # -- the run
    def run(self) -> list[Record]:
        self.hist.add("schedule", seed=self.seed, faults=self.faults, topology=self.topology)
        started = False
        try:
            self.topo.start()
            started = True
            for i, (role, sidecar) in enumerate(WORKERS):
                self.actors.append(_Actor(role, f"worker-{i}", self.topo.conn("worker"), sidecar))
            for i in range(SWEEPERS):
                self.actors.append(_Actor("sweeper", f"sweeper-{i}", self.topo.conn("sweeper")))
            if self.topology in CELERY_TOPOLOGIES:
                for i in range(CELERY_NODES):
                    self.actors.append(_Actor("celery-worker", f"qworker-{i}",
                                              self.topo.conn("worker")))  # fmt: skip
                self.actors.append(_Actor("celery-producer", "qproducer", self.topo.conn("reader")))
            self.actors.append(_Actor("async-reader", "reader-0", self.topo.conn("reader")))
            self.actors.append(_Actor("sync-reader", "reader-1", self.topo.conn("reader")))
            self.actors.append(_Actor("watch-reader", "reader-2", self.topo.conn("reader")))
            self.actors.append(_Actor("http-reader", "reader-3", self.topo.conn("reader")))
            for actor in self.actors:
                self._spawn(actor)
            start = time.monotonic()
            for fault in self.faults:
                self._sleep_until(start + fault["at"])
                skipped = self.skipped
                self._inject(fault)
                self.injected += 1
                if self.skipped == skipped:
                    self.by_kind[fault["kind"]] = self.by_kind.get(fault["kind"], 0) + 1
            self.hist.add("end_faults")
            # the settle time after the last fault even when faults ran late (a slow failover)
            end = max(start + self.seconds, time.monotonic() + settle_time())
            self._sleep_until(end)
            self.hist.add("end")
        finally:
            for actor in self.actors:
                if actor.proc is not None and actor.proc.poll() is not None:
                    self.died.append(f"{actor.name}.{actor.generation} ({actor.proc.returncode})")
                if actor.proc is not None:
                    actor.proc.kill()
                    actor.proc.wait()
                    if actor.proc.stdout is not None:
                        actor.proc.stdout.close()
            for pgid in self.sessions:  # Celery nodes, with the pool children of killed ones
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            try:
                if started:  # (a topology that failed to start has nothing to dump)
                    with contextlib.suppress(redis.RedisError):
                        self._dump()
            finally:
                self.topo.close()
                self.hist.close()
        return load(self.dir)

    def _workers(self) -> list[_Actor]:
        return [a for a in self.actors if a.role in ("async-worker", "sync-worker")]

    def _celery(self, fault: dict[str, Any]) -> None:
        """Inject a fault on a Celery node (:mod:`tests.nemesis.celery_actor`)."""
        kind, d = fault["kind"], fault["seconds"]
        node = [a for a in self.actors if a.role == "celery-worker"][fault["slot"]]
        assert node.proc is not None
        t = time.monotonic()
        if kind == "kill_celery":  # the main process; billiard's pdeathsig SIGKILLs its children
            children = _children_of(node.proc.pid, b"celery_actor")
            self._kill(node)
            for child in children:
                self.hist.add("fault", kind="kill", target=child, start=t, end=t, via="pdeathsig")
            return
        child = _child_of(node.proc.pid, b"celery_actor")
        target = None if child is None else _sidecar_of(child) if "sidecar" in kind else child
        if target is None:  # a child being replaced, or a child between two tasks (no helper)
            self.skipped += 1
            return
        if kind == "kill_pool":
            os.kill(target, signal.SIGKILL)
            self.hist.add("fault", kind="kill", target=target, start=t, end=t, at=fault["at"])
            return
        if kind == "kill_celery_sidecar":
            os.kill(target, signal.SIGKILL)
        elif kind == "stop_celery":
            os.kill(target, signal.SIGSTOP)
            time.sleep(d)
            os.kill(target, signal.SIGCONT)
        else:
            os.kill(target, signal.SIGUSR2)  # SIGUSR1 is billiard's soft time limit
            time.sleep(d)
        what = {"kill_celery_sidecar": "sidecar_kill", "stop_celery": "stop", "gil_celery": "gil"}
        self.hist.add("fault", kind=what[kind], target=child, start=t, end=time.monotonic(),
                      at=fault["at"])  # fmt: skip

    def _inject(self, fault: dict[str, Any]) -> None:
        if fault["kind"] in CELERY_KINDS:
            self._celery(fault)
            return
        kind, d = fault["kind"], fault["seconds"]
        worker = self._workers()[fault["slot"] % len(WORKERS)]
        assert worker.proc is not None
        pid = worker.proc.pid
        ctx: dict[str, Any] = {"t": time.monotonic(), "ns": NS}  # t: the fault's start

        def record(kind_: str, target: object) -> None:
            self.hist.add("fault", kind=kind_, target=target, start=ctx["t"],
                          end=time.monotonic(), at=fault["at"],
                          **ctx.get("fields", {}))  # fmt: skip

        if kind == "kill":
            self._kill(worker)
        elif kind == "kill_sidecar":
            helper = _sidecar_of(pid)
            if helper is None:  # between two jobs: no helper to kill
                self.skipped += 1
            else:
                os.kill(helper, signal.SIGKILL)
                record("sidecar_kill", pid)
        elif kind == "kill_sweeper":
            self._kill([a for a in self.actors if a.role == "sweeper"][fault["slot"]])
        elif kind in ("stop_short", "stop_long", "stop_claimed"):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(d)
            os.kill(pid, signal.SIGCONT)
            record("stop", pid)
        elif kind == "gil":
            os.kill(pid, signal.SIGUSR1)
            time.sleep(d)
            record("gil", pid)
        elif kind == "migrate":
            ctx["job"] = self._job_of(worker)
            if ctx["job"] is None:  # its first job has not started yet: no slot to move
                self.skipped += 1
            else:
                self.topo.inject(kind, d, record, ctx)
        elif kind in SERVER_KINDS:
            self.topo.inject(kind, d, record, ctx)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    def _job_of(self, worker: _Actor) -> str | None:
        """The job ``worker`` runs now (or ran last), from its history file."""
        path = Path(self.dir, f"{worker.name}.{worker.generation}.jsonl")
        job = None
        with contextlib.suppress(OSError):
            for line in path.read_text(encoding="utf-8").splitlines():
                if '"op": "acquire"' in line:
                    with contextlib.suppress(ValueError):
                        job = json.loads(line)["job"]
        return job

    def _dump(self) -> None:
        """Each job's verdict and the ``n`` of every checkpoint in its stream, after the run."""
        client = self.topo.admin()
        keys = KeySchema(NS)
        reader = jobpulse.sync.StatusReader(client, namespace=NS, cache_ttl=0)
        jobs = sorted({r["job"] for r in load(self.dir) if r["op"] == "acquire"})
        for job in jobs:
            st = reader.get(job)
            ns = []
            entries: list[tuple[str, dict[str, str]]] = client.xrange(keys.events(job))  # type: ignore[assignment]
            for _, entry in entries:
                if entry.get("kind") == "checkpoint" and entry.get("details"):
                    ns.append(json.loads(entry["details"]).get("n"))
            kept = client.hget(keys.state(job), "checkpoint")  # the snapshot's last checkpoint
            if kept:
                ns.append(json.loads(kept).get("n"))
            self.hist.add("dump", job=job, state=st.state.name, fence=st.fence or 0,
                          seq=st.seq or 0, checkpoints=ns)  # fmt: skip
        client.close()


@dataclass
class Result:
    """What a run checked: its violations, the summary printed, the operations checked and the
    faults injected by kind."""

    violations: list[Violation]
    summary: str
    operations: int
    faults: dict[str, int]


def run(seed: int, seconds: float, keep: str | None = None, *, topology: str | None = None,
        cover: bool = False) -> Result:  # fmt: skip
    """Run, check, and return the result (its summary printed by ``__main__``)."""
    topology = topology or for_seed(seed)
    directory = Path(keep or tempfile.mkdtemp(prefix="jobpulse-nemesis-"))
    directory.mkdir(parents=True, exist_ok=True)
    faults = schedule(seed, seconds, topology, cover)
    h = Harness(seed, seconds, directory, faults, topology)
    history = h.run()
    violations = check(history, LIMITS)
    # an actor that crashed stops adding operations: its silence would hide what it missed
    violations += [Violation("actor-alive", f"{name} exited on its own (its traceback is above, "
                             "or in its .log in the history for a Celery node)")
                   for name in h.died]  # fmt: skip
    counts: dict[str, int] = {}
    for r in history:
        counts[r["op"]] = counts.get(r["op"], 0) + 1
    ops = sum(v for k, v in counts.items() if k not in ("fault", "schedule", "spawn", "dump"))
    by_op = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(h.by_kind.items()))
    replay = f"--seed {seed} --seconds {seconds:.0f} --topology {topology}" + (
        " --cover" if cover else "")  # fmt: skip
    # the history is kept when asked (--keep) or when a rule broke, else deleted
    kept = keep is not None or bool(violations)
    if not kept:
        shutil.rmtree(directory, ignore_errors=True)
    where = f"history in {directory}" if kept else "history deleted (no violation; --keep keeps it)"
    lines = [f"seed {seed}: topology {topology}, {seconds:.0f} s, {where}",
             f"  replay: python -m tests.nemesis {replay}",
             f"  operations checked: {ops} ({by_op})",
             f"  faults injected: {h.injected - h.skipped} of {h.injected} scheduled ({by_kind})",
             f"  violations: {len(violations)}"]  # fmt: skip
    if h.restarted:
        lines.insert(
            -1,
            f"  Celery nodes restarted after the Celery/kombu defect (not jobpulse's: "
            f"docs/reliability.md): {len(h.restarted)} ({', '.join(h.restarted)})",
        )
    by_rule: dict[str, list[Violation]] = {}
    for v in violations:
        by_rule.setdefault(v.rule, []).append(v)
    for rule, vs in by_rule.items():
        lines.append(f"  {rule}: {len(vs)} violation(s); the first {min(len(vs), SHOWN)}:")
        lines += [report(seed, faults, history, v, LIMITS) if v.records
                  else f"VIOLATION {v.rule}: {v.message}" for v in vs[:SHOWN]]  # fmt: skip
    return Result(violations, "\n".join(lines), ops, dict(h.by_kind))
