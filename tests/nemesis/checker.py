"""The checker: pure code that holds a history (:mod:`tests.nemesis.history`) against the promises
of docs/reliability.md and returns every violation, each with the records that break the rule.

Times are ``t`` (one monotonic clock for every process of the run). A fault record carries the
window ``[start, end]`` it lasted; the faults that may legitimately make a live worker's job read
STALE (a stopped or GIL-holding process, Redis unreachable for long, data lost, the server asleep)
excuse a STALE verdict from their start until ``ttl`` + ``grace`` after their end. Nothing excuses
the other rules, except data loss (and a rollback) where a rule says so: lost data is gone.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .history import Record

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "LOST"})
# Faults that may make a live worker's job read STALE: on the worker's process (target = its
# pid) or on Redis / the network of every worker (target "redis" / "net").
# A GIL hold excuses nothing for a job beaten by the sidecar helper (it beats from its own process);
# a killed helper leaves its owner alive, its job unbeaten until the owner learns it.
# A Sentinel failover (its start: the old master's crash) leaves the jobs unbeaten until the
# promotion and loses the writes the promoted replica missed. A slot migration excuses nothing.
EXCUSE_STALE = frozenset({"stop", "gil", "blackhole", "restart", "rollback", "sleep",
                          "sidecar_kill", "failover"})  # fmt: skip
DATA_LOSS = frozenset({"restart", "rollback", "failover"})
# s: how long a node's record of a receipt or an acknowledgement may follow the event (the
# record is written just after it, by the same thread)
RECORD_LAG = 0.25

RULES = (
    "live-never-stale",
    "dead-stale-within-ttl",
    "claimed-once",
    "delivered-until-acked",
    "dead-job-claimed",
    "fenced-out-never-writes",
    "final-never-overwritten",
    "reader-monotonic",
    "queue-no-overlap",
    "queue-completed-not-rerun",
    "checkpoint-kept",
    "worker-progress",
)
# a worker's own records of its job: each says the job advanced
WORK = ("acquire", "checkpoint", "final", "lease_lost", "job_error")
DONE = ("final", "lease_lost", "job_error")


@dataclass(frozen=True)
class Limits:
    """What the rules allow: the jobs' ``ttl``, the readers' ``cache_ttl``, ``grace`` for one
    read's or one beat's own time, ``claim_within``: how long after a worker's death a sweeper
    must have delivered its job; ``progress_within``: the longest a live worker, not stopped and
    out of every fault's reach, may go without a record of its job advancing."""

    ttl: float
    cache_ttl: float = 0.5
    grace: float = 1.0
    claim_within: float = 3.0
    progress_within: float = 9.0


@dataclass
class Violation:
    rule: str
    message: str
    records: list[Record] = field(default_factory=list)

    @property
    def jobs(self) -> set[str]:
        return {r[k] for r in self.records for k in ("job", "task") if k in r}


def check(history: Sequence[Record], limits: Limits) -> list[Violation]:
    """Every violation of every rule in ``history`` (records in ``t`` order)."""
    h = _Index(history, limits)
    out: list[Violation] = []
    for rule in (h.live_never_stale, h.dead_stale_within_ttl, h.claimed_once,
                 h.delivered_until_acked, h.dead_job_claimed, h.fenced_out_never_writes,
                 h.final_never_overwritten, h.reader_monotonic, h.queue_no_overlap,
                 h.queue_completed_not_rerun, h.checkpoint_kept,
                 h.worker_progress):  # fmt: skip
        out.extend(rule())
    return out


class _Index:
    def __init__(self, history: Sequence[Record], limits: Limits) -> None:
        self.h = list(history)
        self.lim = limits
        self.by_op: dict[str, list[Record]] = defaultdict(list)
        for r in self.h:
            self.by_op[r["op"]].append(r)
        ends = self.by_op["end_faults"]
        last = self.h[-1]["t"] if self.h else 0.0
        self.end_faults = ends[0]["t"] if ends else last
        self.end = last
        self.killed: dict[int, float] = {}  # pid -> when SIGKILLed
        self.windows: list[tuple[str, object, float, float]] = []  # kind, target, start, end
        for f in self.by_op["fault"]:
            if f["kind"] == "kill":
                self.killed.setdefault(f["target"], f["start"])
            self.windows.append((f["kind"], f["target"], f["start"], f["end"]))
        # (when the RDB was saved, when the server restarted from it); a record without
        # ``saved`` (an older history) took its RDB when the restart began
        self.rollbacks = [(f.get("saved", f["start"]), f["start"]) for f in self.by_op["fault"]
                          if f["kind"] == "rollback"]  # fmt: skip
        for g in self.by_op["gil"]:
            self.windows.append(("gil", g["pid"], g["start"], g["end"]))
        self.acquired: dict[tuple[str, int], Record] = {}
        self.by_attempt: dict[tuple[str, int], Record] = {}
        self.acquires: dict[str, list[Record]] = defaultdict(list)  # a job's, by fence
        for a in self.by_op["acquire"]:
            self.acquired[(a["job"], a["fence"])] = a
            self.by_attempt[(a["job"], a["attempt"])] = a
            self.acquires[a["job"]].append(a)
        for runs in self.acquires.values():
            runs.sort(key=lambda a: a["fence"])
        self.reads: dict[str, list[Record]] = defaultdict(list)
        for r in self.by_op["read"]:
            self.reads[r["job"]].append(r)
        self.done: dict[tuple[str, int], Record] = {}  # the worker's final or lease_lost
        for r in self.by_op["final"] + self.by_op["lease_lost"]:
            self.done.setdefault((r["job"], r["fence"]), r)

    # -- helpers
    def _claimed(self, d: Record) -> Record | None:
        """The acquire of the attempt the claim ``d`` took over: the job's last acquire under a
        fence below the claim's (a claim moves the fence past its attempt's). Not by attempt
        number: after a data loss the job starts again from attempt 1 under a newer fence."""
        below = [a for a in self.acquires.get(d["job"], ()) if a["fence"] < d["fence"]]
        return below[-1] if below else self.by_attempt.get((d["job"], d["attempt"]))

    def _excused(self, pid: int, lo: float, hi: float, *, sidecar: bool = False) -> bool:
        """A fault of EXCUSE_STALE on ``pid`` or on every worker overlaps [lo, hi], stretched
        by ttl + grace after its end (a GIL hold not for a job the sidecar beats)."""
        reach = self.lim.ttl + self.lim.grace
        for kind, target, start, end in self.windows:
            mine = kind in EXCUSE_STALE and target in (pid, "redis", "net")
            mine = mine and not (sidecar and kind == "gil")
            if mine and start <= hi and lo <= end + reach:
                return True
        return False

    def _data_lost(self, lo: float, hi: float) -> bool:
        return any(k in DATA_LOSS and lo <= s <= hi for k, _, s, _ in self.windows)

    def _held_at_death(self) -> list[tuple[Record, float]]:
        out = []
        for (job, fence), acq in self.acquired.items():
            k = self.killed.get(acq["pid"])
            done = self.done.get((job, fence))
            if k is not None and acq["t"] <= k and (done is None or done["t"] > k):
                out.append((acq, k))
        return out

    # -- the rules
    def live_never_stale(self) -> Iterable[Violation]:
        seen: set[tuple[str, int]] = set()  # one violation per attempt: its first such read
        for r in self.by_op["read"]:
            if r["state"] != "STALE" or (r["job"], r["fence"]) in seen:
                continue
            acq = self.acquired.get((r["job"], r["fence"]))
            if acq is None:
                continue  # the acquire never returned to its worker: nothing to judge
            pid = acq["pid"]
            k = self.killed.get(pid)
            if k is not None and k <= r["t"]:
                continue
            done = self.done.get((r["job"], r["fence"]))
            if done is not None and done["t"] <= r["t0"]:
                continue
            lo = r["t0"] - self.lim.cache_ttl
            if self._excused(pid, lo, r["t"], sidecar=bool(acq.get("sidecar"))):
                continue
            seen.add((r["job"], r["fence"]))
            yield Violation("live-never-stale",
                            f"job {r['job']} read STALE while its worker (pid {pid}) was alive, "
                            "running and reachable", [acq, r])  # fmt: skip

    def dead_stale_within_ttl(self) -> Iterable[Violation]:
        bound = self.lim.ttl + self.lim.cache_ttl + self.lim.grace
        for acq, k in self._held_at_death():
            for r in self.reads[acq["job"]]:
                if r["t0"] > k + bound and r["fence"] == acq["fence"] and r["state"] == "RUNNING":
                    yield Violation("dead-stale-within-ttl",
                                    f"job {acq['job']} still read RUNNING {r['t0'] - k:.2f} s "
                                    f"after its worker (pid {acq['pid']}) was killed",
                                    [acq, r])  # fmt: skip
                    break

    def claimed_once(self) -> Iterable[Violation]:
        fences: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for d in self.by_op["deliver"]:  # one attempt: its acquire's fence (or its number)
            acq = self._claimed(d)
            fences[(d["job"], acq["fence"] if acq else -d["attempt"])].append(d)
        for (job, _), ds in fences.items():
            if len({d["fence"] for d in ds}) > 1:
                yield Violation("claimed-once",
                                f"attempt {ds[0]['attempt']} of job {job} claimed more than once "
                                f"(fences {sorted({d['fence'] for d in ds})})", ds)  # fmt: skip

    def delivered_until_acked(self) -> Iterable[Violation]:
        acked = {(a["job"], a["attempt"], a["fence"]) for a in self.by_op["ack"]}
        seen: set[tuple[str, int, int]] = set()
        for d in self.by_op["deliver"]:
            key = (d["job"], d["attempt"], d["fence"])
            if key in acked or key in seen or d["t"] > self.end_faults:
                continue
            if self._data_lost(d["t"], self.end):
                continue  # the claim was lost with the data: nothing is left to deliver
            if any(a["fence"] > d["fence"] and a["t"] >= d["t"]
                   for a in self.acquires.get(d["job"], ())):  # fmt: skip
                continue  # a new attempt started (a queue's redelivery): it cleared the claim
            seen.add(key)
            yield Violation("delivered-until-acked",
                            f"the claim of attempt {d['attempt']} of job {d['job']} was never "
                            "acknowledged and not delivered again until it was", [d])  # fmt: skip

    def dead_job_claimed(self) -> Iterable[Violation]:
        delivered = set()  # the attempts claimed: (job, acquire fence)
        for d in self.by_op["deliver"]:
            acq = self._claimed(d)
            if acq is not None:
                delivered.add((d["job"], acq["fence"]))
        reach = self.lim.ttl + self.lim.claim_within
        for acq, k in self._held_at_death():
            if k + reach > self.end_faults or (acq["job"], acq["fence"]) in delivered:
                continue
            if any(a["job"] == acq["job"] and a["fence"] > acq["fence"] and a["t"] <= k + reach
                   for a in self.by_op["acquire"]):  # fmt: skip
                continue  # taken over by its next attempt (a queue's redelivery) in time
            if self._data_lost(k - self.lim.ttl, k + reach):
                continue  # the job itself may be gone
            yield Violation(
                "dead-job-claimed",
                f"job {acq['job']} (attempt {acq['attempt']}) was held by a worker "
                "killed at the time of the fault record, and no sweeper delivered it",
                [acq, *[f for f in self.by_op["fault"] if f["target"] == acq["pid"]]],
            )

    def fenced_out_never_writes(self) -> Iterable[Violation]:
        for d in self.by_op["deliver"]:
            acq = self._claimed(d)
            if acq is not None:
                for w in self.by_op["checkpoint"] + self.by_op["final"]:
                    if (w["job"], w["fence"]) == (d["job"], acq["fence"]) and w["t0"] > d["t"]:
                        yield Violation("fenced-out-never-writes",
                                        f"a write of job {d['job']} under fence {acq['fence']} "
                                        f"was acknowledged after the claim (fence {d['fence']})",
                                        [acq, d, w])  # fmt: skip
            for r in self.reads[d["job"]]:
                later = r["t0"] > d["t"] + self.lim.cache_ttl and r["state"] != "UNKNOWN"
                if later and r["fence"] < d["fence"] and not self._data_lost(d["t"], r["t"]):
                    yield Violation("fenced-out-never-writes",
                                    f"job {d['job']} read under fence {r['fence']} after "
                                    f"the claim set fence {d['fence']}", [d, r])  # fmt: skip
                    break

    def final_never_overwritten(self) -> Iterable[Violation]:
        """After a final state is written (the worker's final write returned) or read, every read
        that starts later (past the readers' cache) shows it: the same state under the same fence,
        or a later attempt after LOST. Only data lost on the server in between excuses it."""
        ends = [{**f, "state": f["status"]} for f in self.by_op["final"]]
        # (a 304 is not a read of the server's state: it says that what the client held is not
        # older than what the server holds, which after a data loss may be older still)
        ends += [r for r in self.by_op["read"] if r["state"] in TERMINAL and r.get("http") != 304]
        flagged: set[tuple[str, int]] = set()
        reruns = self._lawful_reruns()
        for f in ends:
            key = (f["job"], f["fence"])
            if key in flagged:
                continue
            for r in self.reads[f["job"]]:
                if r["t0"] <= f["t"] + self.lim.cache_ttl:
                    continue
                same = r["fence"] == f["fence"] and r["state"] == f["state"]
                resumed = f["state"] == "LOST" and r["fence"] > f["fence"]
                # a queue's lawful redelivery of the completed task runs the id again (a new
                # attempt under a newer fence): its own rule judges the rerun
                rerun = r["fence"] > f["fence"] and any(
                    f["t0"] <= t <= r["t0"] for t in reruns.get(f["job"], ())
                )
                # the final write may land from its start on; a terminal read may come from
                # the reader's cache, filled up to cache_ttl before the read started
                since = f["t0"] - (self.lim.cache_ttl if f["op"] == "read" else 0.0)
                if same or resumed or rerun or self._data_lost(since, r["t"]):
                    continue
                flagged.add(key)
                yield Violation("final-never-overwritten",
                                f"job {f['job']} ended {f['state']} under fence {f['fence']}, "
                                f"then read {r['state']} under fence {r['fence']}",
                                [f, r])  # fmt: skip
                break

    def reader_monotonic(self) -> Iterable[Violation]:
        """Per reader process, reader kind and job, the ``read`` verdicts and the watch's
        ``event`` records never go back to an earlier ``(fence, seq)``; and a read that was
        given a version (``given``: the ETag an HTTP request sent in If-None-Match) never answers
        an older one (a 304 answers the version given)."""
        best: dict[tuple[str, str, str], Record] = {}
        reads = sorted(self.by_op["read"] + self.by_op["event"], key=lambda r: r["t"])
        for r in reads:
            if r["state"] == "UNKNOWN":
                continue
            key = (r["proc"], r.get("reader", ""), r["job"])
            given = r.get("given")
            if given is not None and (r["fence"], r["seq"]) < tuple(given):
                yield Violation("reader-monotonic",
                                f"reader {key[0]}/{key[1]} was given job {r['job']} at "
                                f"(fence, seq) {tuple(given)} and answered the older "
                                f"({r['fence']}, {r['seq']})", [r])  # fmt: skip
                continue
            prev = best.get(key)
            if prev is not None and (r["fence"], r["seq"]) < (prev["fence"], prev["seq"]):
                yield Violation("reader-monotonic",
                                f"reader {key[0]}/{key[1]} showed job {r['job']} at "
                                f"(fence, seq) ({r['fence']}, {r['seq']}) after "
                                f"({prev['fence']}, {prev['seq']})", [prev, r])  # fmt: skip
                continue
            best[key] = r

    def _executions(self) -> dict[str, list[tuple[Record, float, Record | None]]]:
        """Each task's runs: (exec_start, when it stopped, its exec_end or None). A run's end is
        the first exec_end of the task in the same process after its start: one pool child may
        run the same task twice (a delivery kombu restored and the node received again)."""
        runs: dict[str, list[tuple[Record, float, Record | None]]] = defaultdict(list)
        ends: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for e in self.by_op["exec_end"]:
            ends[(e["task"], e["pid"])].append(e)
        for s in self.by_op["exec_start"]:
            e = next((x for x in ends[(s["task"], s["pid"])] if x["t"] >= s["t"]), None)
            if e is not None:
                ends[(s["task"], s["pid"])].remove(e)
            stop = e["t"] if e else self.killed.get(s["pid"], self.end)
            runs[s["task"]].append((s, stop, e))
        return runs

    def queue_no_overlap(self) -> Iterable[Violation]:
        for task, runs in self._executions().items():
            runs.sort(key=lambda x: x[0]["t"])
            for (a, a_end, _), (b, _, _) in itertools.pairwise(runs):
                if b["t"] < a_end and b["pid"] != a["pid"]:
                    yield Violation("queue-no-overlap",
                                    f"task {task} executing in pids {a['pid']} and {b['pid']} "
                                    "at once", [a, b])  # fmt: skip

    def queue_completed_not_rerun(self) -> Iterable[Violation]:
        """A completed task is not started again, unless its delivery was not acknowledged
        and the node's main process (which acknowledges it) was killed before it could, or the
        server went back to an older RDB taken before the acknowledgement, or kombu put it
        back on the queue when it closed the node's channel (a lost connection: running tasks'
        deliveries too): at-least-once delivery, which no heartbeat changes."""
        for task, runs in self._executions().items():
            done = [(s, e) for s, _, e in runs if e is not None and e["outcome"] == "completed"]
            for s, _, _ in runs:
                first = [(r, e) for r, e in done if e["t"] < s["t"]][:1]
                if first and not self._redelivered(*first[0], s):
                    yield Violation("queue-completed-not-rerun",
                                    f"task {task} started again after it completed",
                                    [first[0][1], s])  # fmt: skip
                    break

    def _lawful_reruns(self) -> dict[str, list[float]]:
        """The start times of each task's runs after it completed that its queue lawfully
        delivered again (:meth:`_redelivered`)."""
        out: dict[str, list[float]] = defaultdict(list)
        for task, runs in self._executions().items():
            done = [(s, e) for s, _, e in runs if e is not None and e["outcome"] == "completed"]
            for s, _, _ in runs:
                first = [(r, e) for r, e in done if e["t"] < s["t"]][:1]
                if first and self._redelivered(*first[0], s):
                    out[task].append(s["t"])
        return out

    def _redelivered(self, ran: Record, end: Record, start: Record) -> bool:
        """Whether the delivery of the completed run (``ran`` .. ``end``) may lawfully come back
        by ``start``: it was put back on the queue after the receipt that led to the run."""
        lo, hi = end["t"], start["t"]
        task, node = end["task"], end.get("node_pid", -1)
        # the receipt that led to the completed run: the node's last receipt of this task before
        # the run started (a copy received again while it ran, after a restore, is a later one)
        got = [r["t"] for r in self.by_op["q_received"]
               if r["pid"] == node and r["task"] == task and r["t"] <= ran["t"]]  # fmt: skip
        since = max(got, default=ran["t"])
        # kombu put a closed channel's deliveries back on the queue (a lost connection), this
        # node's or another's that held a copy
        if any(task in r["tasks"] and since <= r["t"] <= hi for r in self.by_op["q_restore"]):
            return True
        # the server went back to an RDB taken before the receipt or the acknowledgement and
        # restarted after it: the message is back on the queue, or back in the unacked index
        # (restored once its visibility timeout passed)
        acks = [a["t"] for a in self.by_op["q_ack"] if a["task"] == task and lo <= a["t"] <= hi]
        for saved, restarted in self.rollbacks:
            if restarted < hi and any(saved <= t <= restarted + RECORD_LAG
                                      for t in (since, *acks)):  # fmt: skip
                return True
        killed = self.killed.get(node)
        return not acks and killed is not None and lo - self.lim.grace <= killed <= hi

    def _paused(self, pid: int, lo: float, hi: float) -> float:
        """The time of [lo, hi] out of every fault's reach: faults on ``pid`` (a stop, a GIL
        hold, its helper killed) or on every worker (Redis, the network), each reaching
        ``2 ttl + grace`` past its end (a lease lost meanwhile ends its job at the next beat)."""
        reach = 2 * self.lim.ttl + self.lim.grace
        spans = sorted((max(lo, s), min(hi, e + reach)) for k, tg, s, e in self.windows
                       if tg in (pid, "redis", "net") and k != "kill" and s <= hi
                       and e + reach >= lo)  # fmt: skip
        covered, at = 0.0, lo
        for s, e in spans:
            s = max(s, at)
            if e > s:
                covered += e - s
                at = e
        return (hi - lo) - covered

    def worker_progress(self) -> Iterable[Violation]:
        """A worker process that is alive and not stopped keeps its job advancing: its records
        (acquire, a checkpoint every 5 steps, the end) come at most ``progress_within`` apart,
        counting only the time out of every fault's reach. A worker of the fleet starts its
        next job at once, so the time between two jobs counts too; a queue's child waits for
        deliveries, so only the time within a job counts for it. Until the run ends or the
        process is killed."""
        by_pid: dict[int, list[Record]] = defaultdict(list)
        for r in self.h:
            if r["op"] in WORK:
                by_pid[r["pid"]].append(r)
        for pid, recs in by_pid.items():
            queue = any(r.get("shell") == "celery" for r in recs)
            stop = min(self.killed.get(pid, self.end), self.end)
            tail = {"t": stop, "op": "(the run's end or its kill)"}
            alive = [r for r in recs if r["t"] <= stop]
            for a, b in itertools.pairwise([*alive, tail]):
                if queue and a["op"] in DONE:
                    continue
                silent = self._paused(pid, a["t"], b["t"])
                if silent > self.lim.progress_within:
                    yield Violation("worker-progress",
                                    f"worker pid {pid} ({a['proc']}), alive and not stopped, "
                                    f"recorded nothing for {b['t'] - a['t']:.1f} s ({silent:.1f} s "
                                    f"out of every fault's reach) after {a['op']} of job "
                                    f"{a['job']}", [a] + ([b] if "pid" in b else []))  # fmt: skip
                    break

    def checkpoint_kept(self) -> Iterable[Violation]:
        dumps = {d["job"]: d for d in self.by_op["dump"]}
        cps: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for c in self.by_op["checkpoint"]:
            cps[(c["job"], c["fence"])].append(c)
        for f in self.by_op["final"]:
            d = dumps.get(f["job"])
            mine = cps[(f["job"], f["fence"])]
            if d is None or not mine or self._data_lost(f["t"], self.end):
                continue
            losses = [s for k, _, s, _ in self.windows if k in DATA_LOSS and s < f["t"]]
            cut = max(losses, default=float("-inf"))
            # After a data loss the repair beat brings back the checkpoint the worker holds
            # then (its latest): the ones acknowledged after the loss, or else the last before.
            after = [c for c in mine if c["t0"] >= cut]
            need = after or [c for c in mine if c["t0"] < cut][-1:]
            missing = [c for c in need if c["n"] not in d["checkpoints"]]
            if missing:
                yield Violation(
                    "checkpoint-kept",
                    f"checkpoint(s) {[c['n'] for c in missing]} of job {f['job']} "
                    "were acknowledged but are not in its stream",
                    [*missing, f, d],
                )
        for dl in self.by_op["deliver"]:
            acq = self._claimed(dl)
            mine = [c for c in cps[(dl["job"], acq["fence"])] if c["t"] < dl["t"]] if acq else []
            if not mine:
                continue
            last = mine[-1]
            if (dl["checkpoint"] is None or dl["checkpoint"] < last["n"]) and not self._data_lost(
                last["t0"], dl["t"]
            ):
                yield Violation("checkpoint-kept",
                                f"the claim of job {dl['job']} carries checkpoint "
                                f"{dl['checkpoint']}, its worker saw {last['n']} acknowledged",
                                [last, dl])  # fmt: skip


def report(seed: int, schedule: Sequence[Record], history: Sequence[Record],
           violation: Violation, limits: Limits) -> str:  # fmt: skip
    """The text a failed run prints: the seed, the fault schedule and the slice of history."""
    ts = [r["t"] for r in violation.records]
    lo, hi = min(ts) - limits.ttl - limits.grace, max(ts) + limits.grace
    jobs = violation.jobs
    # the processes of the records (a reader's own other reads left out) and the faults' targets
    pids = {r["pid"] for r in violation.records if r["op"] != "read"} | {
        r.get("target") for r in violation.records if "target" in r
    }
    part = [r for r in history if lo <= r["t"] <= hi and (
        r.get("job") in jobs or r.get("task") in jobs or jobs & set(r.get("tasks", ()))
        or r["op"] == "fault" or r["pid"] in pids)]  # fmt: skip
    lines = [f"VIOLATION {violation.rule}: {violation.message}",
             f"  seed {seed} (replay: python -m tests.nemesis --seed {seed} ...)",
             "  fault schedule (offset s, kind, target slot, seconds):"]  # fmt: skip
    lines += [f"    {f['at']:7.2f} {f['kind']:<10} {f['slot']!s:<8} {f['seconds']:.2f}"
              for f in schedule]  # fmt: skip
    lines.append(f"  history slice ({len(part)} records, t {lo:.2f} .. {hi:.2f}):")
    lines += ["    " + _line(r) for r in part]
    return "\n".join(lines)


def _line(r: Record) -> str:
    skip = {"t", "wall", "proc", "pid", "op"}
    rest = " ".join(f"{k}={v}" for k, v in r.items() if k not in skip)
    return f"{r['t']:.3f} {r['proc']}[{r['pid']}] {r['op']} {rest}"
