"""The harness of a nemesis run: a private redis-server, a fault proxy between it and the workers,
the actor processes (:mod:`tests.nemesis.actors`), and a seeded schedule of faults.

The schedule is drawn from ``random.Random(seed)`` before anything starts and depends on nothing
else, so a seed replays the same faults in the same order at the same offsets (the processes'
own timing differs from run to run, as it does on any machine). Faults come one after another,
never two at once; after the last one the run goes on for ``settle`` seconds without faults, so
that every claim can be delivered and acknowledged before the checker looks.
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
from jobpulse._provision import RedisServer

from ..faults.proxy import FaultProxy
from ..support import ROOT
from .checker import Limits, Violation, check, report
from .history import History, Record, load

NS = "nemesis"
SHOWN = 3  # violations printed in full per rule
TTL = 3.0
INTERVAL = 0.5
# (kind, weight): a fault's kind is drawn with these weights.
KINDS: tuple[tuple[str, int], ...] = (
    ("kill", 4), ("kill_sweeper", 1), ("stop_short", 2), ("stop_long", 2), ("gil", 2),
    ("restart", 1), ("rollback", 1), ("latency", 2), ("cut", 2), ("lost_reply", 2),
    ("blackhole", 1), ("sleep", 1), ("kill_sidecar", 2),
    # on a Celery node (tests/nemesis/celery_actor.py): SIGKILL of its pool child running a
    # task, of its main process, of the child's sidecar helper; SIGSTOP of the child; a GIL hold
    ("kill_pool", 2), ("kill_celery", 1), ("kill_celery_sidecar", 1), ("stop_celery", 1),
    ("gil_celery", 2),
    # a worker paused until a sweeper claimed its job: resumed, it must be fenced out
    ("stop_claimed", 1),
)  # fmt: skip
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


def schedule(seed: int, seconds: float) -> list[dict[str, Any]]:
    """The faults of a run: offset ``at`` (s from the start), ``kind``, ``slot`` (which worker or
    sweeper), ``seconds`` (how long it lasts)."""
    rng = random.Random(seed)
    kinds, weights = zip(*KINDS, strict=True)
    out: list[dict[str, Any]] = []
    at = 3.0
    settle = settle_time()
    while True:
        kind = rng.choices(kinds, weights)[0]
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
        slot = rng.randrange(SWEEPERS if kind == "kill_sweeper" else len(WORKERS))
        if kind.endswith("celery") or "_celery_" in kind or kind == "kill_pool":
            slot %= CELERY_NODES
        if kind == "stop_celery":
            seconds_ = rng.uniform(0.2, 2.5 * TTL)
        if kind == "kill_sidecar":
            slot = SIDECARS[slot % len(SIDECARS)]
        if kind == "stop_claimed":  # a sidecar helper beats on while its owner is stopped
            slot = [i for i in range(len(WORKERS)) if i not in SIDECARS][slot % 2]
        if at + seconds_ > seconds - settle:
            return out
        out.append({"at": round(at, 3), "kind": kind, "slot": slot, "seconds": round(seconds_, 3)})
        at += seconds_ + rng.uniform(1.0, 3.0)


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
    url: str
    sidecar: bool = False
    generation: int = 0
    proc: subprocess.Popen[str] | None = None


@dataclass
class Harness:
    seed: int
    seconds: float
    dir: Path
    faults: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = RedisServer(args=["--enable-debug-command", "yes"])
        self.proxy: FaultProxy | None = None
        self.hist = History(self.dir, "harness-0")
        self.actors: list[_Actor] = []
        self.injected = 0
        self.skipped = 0  # scheduled but found nothing to hit (a sidecar kill between jobs)
        self.sessions: list[int] = []  # the process groups of the Celery nodes ever started

    # -- processes
    def _spawn(self, actor: _Actor) -> None:
        actor.generation += 1
        cfg = {"dir": str(self.dir), "proc": f"{actor.name}.{actor.generation}",
               "url": actor.url, "ns": NS, "ttl": TTL, "interval": INTERVAL, "seed": self.seed,
               "gil": GIL_HOLD, "redeliver_after": REDELIVER_AFTER,
               "sidecar": actor.sidecar, "every": CELERY_EVERY}  # fmt: skip
        module, role, celery = "tests.nemesis.actors", actor.role, actor.role.startswith("celery-")
        if celery:  # in a session of its own: its pool children are killed with it at the end
            module, role = "tests.nemesis.celery_actor", role.removeprefix("celery-")
        proc = subprocess.Popen(
            [sys.executable, "-m", module, role, json.dumps(cfg)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=celery,
        )  # fmt: skip
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

    # -- the run
    def run(self) -> list[Record]:
        self.hist.add("schedule", seed=self.seed, faults=self.faults)
        self.server.start()
        self.proxy = FaultProxy(self.server.port).start()
        try:
            for i, (role, sidecar) in enumerate(WORKERS):
                self.actors.append(_Actor(role, f"worker-{i}", self.proxy.url, sidecar))
            for i in range(SWEEPERS):
                self.actors.append(_Actor("sweeper", f"sweeper-{i}", self.server.url))
            for i in range(CELERY_NODES):
                self.actors.append(_Actor("celery-worker", f"qworker-{i}", self.proxy.url))
            self.actors.append(_Actor("celery-producer", "qproducer", self.server.url))
            self.actors.append(_Actor("async-reader", "reader-0", self.server.url))
            self.actors.append(_Actor("sync-reader", "reader-1", self.server.url))
            for actor in self.actors:
                self._spawn(actor)
            start = time.monotonic()
            for fault in self.faults:
                time.sleep(max(0.0, start + fault["at"] - time.monotonic()))
                self._inject(fault)
                self.injected += 1
            self.hist.add("end_faults")
            time.sleep(max(0.0, start + self.seconds - time.monotonic()))
            self.hist.add("end")
        finally:
            for actor in self.actors:
                if actor.proc is not None:
                    actor.proc.kill()
                    actor.proc.wait()
            for pgid in self.sessions:  # Celery nodes, with the pool children of killed ones
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            for actor in self.actors:
                if actor.proc is not None and actor.proc.stdout is not None:
                    actor.proc.stdout.close()
            with contextlib.suppress(redis.RedisError):
                self._dump()
            self.proxy.close()
            self.server.close()
            self.hist.close()
        return load(self.dir)

    def _workers(self) -> list[_Actor]:
        return [a for a in self.actors if a.role in ("async-worker", "sync-worker")]

    def _celery(self, fault: dict[str, Any]) -> bool:
        """Inject a fault on a Celery node (:mod:`tests.nemesis.celery_actor`); False: not one."""
        kind, d = fault["kind"], fault["seconds"]
        if kind not in ("kill_pool", "kill_celery", "kill_celery_sidecar", "stop_celery",
                        "gil_celery"):  # fmt: skip
            return False
        node = [a for a in self.actors if a.role == "celery-worker"][fault["slot"]]
        assert node.proc is not None
        t = time.monotonic()
        if kind == "kill_celery":  # the main process; billiard's pdeathsig SIGKILLs its children
            children = _children_of(node.proc.pid, b"celery_actor")
            self._kill(node)
            for child in children:
                self.hist.add("fault", kind="kill", target=child, start=t, end=t, via="pdeathsig")
            return True
        child = _child_of(node.proc.pid, b"celery_actor")
        target = None if child is None else _sidecar_of(child) if "sidecar" in kind else child
        if target is None:  # a child being replaced, or a child between two tasks (no helper)
            self.skipped += 1
            return True
        if kind == "kill_pool":
            os.kill(target, signal.SIGKILL)
            self.hist.add("fault", kind="kill", target=target, start=t, end=t, at=fault["at"])
            return True
        if kind == "kill_celery_sidecar":
            os.kill(target, signal.SIGKILL)
        elif kind == "stop_celery":
            os.kill(target, signal.SIGSTOP)
            time.sleep(d)
            os.kill(target, signal.SIGCONT)
        else:
            os.kill(target, signal.SIGUSR2)
            time.sleep(d)
        what = {"kill_celery_sidecar": "sidecar_kill", "stop_celery": "stop", "gil_celery": "gil"}
        self.hist.add("fault", kind=what[kind], target=child, start=t, end=time.monotonic(),
                      at=fault["at"])  # fmt: skip
        return True

    def _inject(self, fault: dict[str, Any]) -> None:
        assert self.proxy is not None
        if self._celery(fault):
            return
        kind, d = fault["kind"], fault["seconds"]
        worker = self._workers()[fault["slot"] % len(WORKERS)]
        assert worker.proc is not None
        pid = worker.proc.pid
        t = time.monotonic()

        def record(kind_: str, target: object) -> None:
            self.hist.add(
                "fault", kind=kind_, target=target, start=t, end=time.monotonic(), at=fault["at"]
            )

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
        elif kind == "restart":
            Path(self.server.dir, "dump.rdb").unlink(missing_ok=True)
            self.server.restart()
            record("restart", "redis")
        elif kind == "rollback":
            with redis.Redis(port=self.server.port) as c:
                c.save()  # the RDB the restart will load: everything written after it is lost
            time.sleep(d)
            t = time.monotonic()
            self.server.restart()
            Path(self.server.dir, "dump.rdb").unlink(missing_ok=True)
            record("rollback", "redis")
        elif kind == "latency":
            self.proxy.latency, self.proxy.jitter = 0.2, 0.05
            time.sleep(d)
            self.proxy.latency, self.proxy.jitter = 0.0, 0.0
            record("latency", "net")
        elif kind == "cut":
            self.proxy.reset()
            record("cut", "net")
        elif kind == "lost_reply":
            self.proxy.drop_reply_once(b"EVALSHA").wait(2.0)
            record("lost_reply", "net")
        elif kind == "blackhole":
            self.proxy.blackhole = True
            time.sleep(d)
            self.proxy.blackhole = False
            record("blackhole", "net")
        elif kind == "sleep":
            with redis.Redis(port=self.server.port, socket_timeout=d + 5) as c:
                c.execute_command("DEBUG", "SLEEP", f"{d:.3f}")
            record("sleep", "redis")
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    def _dump(self) -> None:
        """Each job's verdict and the ``n`` of every checkpoint in its stream, after the run."""
        client = redis.Redis(port=self.server.port, decode_responses=True)
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


def run(seed: int, seconds: float, keep: str | None = None) -> tuple[list[Violation], str]:
    """Run, check, and return the violations and a summary (printed by ``__main__``)."""
    directory = Path(keep or tempfile.mkdtemp(prefix="jobpulse-nemesis-"))
    directory.mkdir(parents=True, exist_ok=True)
    faults = schedule(seed, seconds)
    h = Harness(seed, seconds, directory, faults)
    history = h.run()
    violations = check(history, LIMITS)
    counts: dict[str, int] = {}
    for r in history:
        counts[r["op"]] = counts.get(r["op"], 0) + 1
    kinds: dict[str, int] = {}
    for f in faults:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    ops = sum(v for k, v in counts.items() if k not in ("fault", "schedule", "spawn", "dump"))
    by_op = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    # the history is kept when asked (--keep) or when a rule broke, else deleted
    kept = keep is not None or bool(violations)
    if not kept:
        shutil.rmtree(directory, ignore_errors=True)
    where = (
        f"history in {directory}" if kept else "history deleted (no violation; --keep DIR keeps it)"
    )
    lines = [f"seed {seed}: {seconds:.0f} s, {where}",
             f"  operations checked: {ops} ({by_op})",
             f"  faults injected: {h.injected - h.skipped} of {h.injected} scheduled ({by_kind})",
             f"  violations: {len(violations)}"]  # fmt: skip
    by_rule: dict[str, list[Violation]] = {}
    for v in violations:
        by_rule.setdefault(v.rule, []).append(v)
    for rule, vs in by_rule.items():
        lines.append(f"  {rule}: {len(vs)} violation(s); the first {min(len(vs), SHOWN)}:")
        lines += [report(seed, faults, history, v, LIMITS) for v in vs[:SHOWN]]
    return violations, "\n".join(lines)
