"""The servers of a nemesis run (topologies) and the faults that act on them.

A topology starts its servers, says how each actor connects (``conn(role)``: a JSON-able dict the
actor turns into a client with :func:`async_client` / :func:`sync_client` / :func:`factory`),
gives the harness an admin client for the final dump, and injects its server-level faults:

* ``single``: one private ``redis-server``; the workers connect through a
  :class:`tests.faults.proxy.FaultProxy` (sweepers and readers directly). Faults: ``restart``
  (data lost), ``rollback`` (restart from an older RDB), ``latency``, ``cut``, ``lost_reply``,
  ``blackhole`` (through the proxy), ``sleep`` (``DEBUG SLEEP`` past a script's time).
* ``sentinel``: a master, one replica and three sentinels; every actor connects through
  Sentinel (``redis.asyncio.sentinel`` / ``redis.sentinel``; the sidecar helper with a
  ``client_factory``). Fault ``failover``: the replica is pointed at a port nobody listens on
  (``REPLICAOF``: it keeps its data and stops replicating) while writes land on the master for
  ``seconds``, then the master is SIGKILLed; the sentinels promote the replica, which missed
  those writes (what a worker wrote then is lost: a rollback as the beats' ``landed`` check
  sees it). The old master comes back empty and the sentinels make it the new replica.
* ``cluster``: a 3-master :class:`jobpulse._provision.LocalCluster` (no replicas); every actor
  uses a ``RedisCluster`` client. Fault ``migrate``: the slot of a worker's current job moves to
  another master: held MIGRATING / IMPORTING with its keys already moved for ``seconds`` (every
  command for them is answered ASK), then ``SETSLOT NODE`` on every master (MOVED from then on),
  as ``tests/integration/test_cluster_resharding.py`` does.

No proxy sits in front of the Sentinel or Cluster servers (their clients learn the servers'
addresses from the servers), so the proxy's faults run on ``single`` only; the process faults
(kills, stops, GIL holds) run on every topology.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from jobpulse._protocol.keys import KeySchema
from jobpulse._provision import LocalCluster, RedisServer, _info_has, free_port

from ..faults.proxy import FaultProxy

Conn = dict[str, Any]
Record = Callable[[str, object], None]  # record(kind, target): the fault's history record
SERVER_KINDS = frozenset({"restart", "rollback", "latency", "cut", "lost_reply", "blackhole",
                          "sleep", "failover", "migrate"})  # fmt: skip
SENTINEL_NAME = "nemesis"


# -- the actors' clients
def async_client(conn: Conn) -> Any:
    """An asyncio client for ``conn``."""
    if conn["kind"] == "sentinel":
        return sentinel_master(tuple(map(tuple, conn["sentinels"])), conn["name"])
    if conn["kind"] == "cluster":
        return cluster_client(conn["url"])
    return aioredis.Redis.from_url(conn["url"])


def sync_client(conn: Conn, socket_timeout: float) -> Any:
    """A blocking client for ``conn`` (``socket_timeout``: see docs/sync.md)."""
    if conn["kind"] == "sentinel":
        sentinel = Sentinel([tuple(a) for a in conn["sentinels"]], socket_timeout=1.0)
        return sentinel.master_for(conn["name"], socket_timeout=socket_timeout)
    if conn["kind"] == "cluster":
        return RedisCluster.from_url(conn["url"], socket_timeout=socket_timeout)
    return redis.Redis.from_url(conn["url"], socket_timeout=socket_timeout)


def factory(conn: Conn) -> Callable[[], Any] | None:
    """The sidecar helper's ``client_factory`` for ``conn`` (None: rebuilt from the client)."""
    if conn["kind"] == "sentinel":
        return functools.partial(
            sentinel_master, tuple(map(tuple, conn["sentinels"])), conn["name"]
        )
    if conn["kind"] == "cluster":
        return functools.partial(cluster_client, conn["url"])
    return None


def sentinel_master(addresses: tuple[tuple[str, int], ...], name: str) -> Any:
    """The master of ``name`` through the Sentinels at ``addresses`` (asyncio)."""
    sentinel = AsyncSentinel(list(addresses), socket_timeout=1.0)
    return sentinel.master_for(name, socket_timeout=2.0)


def cluster_client(url: str) -> AsyncCluster:
    """An asyncio Cluster client from one node's URL."""
    return AsyncCluster.from_url(url)


# -- the topologies
class Topology:
    name = ""
    faults: frozenset[str] = frozenset()  # its server-level fault kinds (weights: run.KINDS)

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def conn(self, role: str) -> Conn:
        """How an actor of ``role`` (``worker``, ``sweeper``, ``reader``) connects."""
        raise NotImplementedError

    def admin(self) -> Any:
        """A blocking client (decoded replies) on the current data, for the dump."""
        raise NotImplementedError

    def inject(self, kind: str, seconds: float, record: Record, ctx: dict[str, Any]) -> None:
        raise ValueError(f"unknown fault kind {kind!r} for topology {self.name}")


class Single(Topology):
    """One redis-server; the workers behind the fault proxy."""

    name = "single"
    faults = frozenset({"restart", "rollback", "latency", "cut", "lost_reply", "blackhole",
                        "sleep"})  # fmt: skip

    def __init__(self) -> None:
        self.server = RedisServer(args=["--enable-debug-command", "yes"])
        self.proxy: FaultProxy | None = None

    def start(self) -> None:
        self.server.start()
        self.proxy = FaultProxy(self.server.port).start()

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.server.close()

    def conn(self, role: str) -> Conn:
        assert self.proxy is not None
        return {"kind": "single", "url": self.proxy.url if role == "worker" else self.server.url}

    def admin(self) -> Any:
        return redis.Redis(port=self.server.port, decode_responses=True)

    def inject(self, kind: str, seconds: float, record: Record, ctx: dict[str, Any]) -> None:
        assert self.proxy is not None
        d = seconds
        if kind == "restart":
            Path(self.server.dir, "dump.rdb").unlink(missing_ok=True)
            self.server.restart()
            record("restart", "redis")
        elif kind == "rollback":
            # (when the RDB was taken: before SAVE runs, so that every write it may miss is after)
            ctx["fields"] = {"saved": time.monotonic()}
            with redis.Redis(port=self.server.port) as c:
                c.save()  # the RDB the restart will load: everything written after it is lost
            time.sleep(d)
            ctx["t"] = time.monotonic()
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
            super().inject(kind, seconds, record, ctx)


class SentinelTopology(Topology):
    """A master, one replica, three sentinels (quorum 2)."""

    name = "sentinel"
    faults = frozenset({"failover"})
    # ms: the sentinels see a dead master down after this. Not shorter: on a loaded machine a
    # sentinel's new link to a just promoted master can go that long unanswered, and the
    # sentinels then fail it over again (to the old master, back empty: every job lost).
    DOWN_AFTER = 2000
    ARGS = ("--repl-diskless-sync-delay", "0")  # a replica's full sync starts at once

    def __init__(self) -> None:
        self.nodes = [RedisServer(args=list(self.ARGS)), RedisServer(args=list(self.ARGS))]
        self.master = 0  # index of the current master in nodes
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: list[Any] = []
        self.dir = Path(self.nodes[0].dir, "sentinels")

    def start(self) -> None:
        master, replica = self.nodes
        master.start()
        replica.args = [*self.ARGS, "--replicaof", "127.0.0.1", str(master.port)]
        replica.start()
        self._wait(lambda: _info(replica.port, "master_link_status:up"), "the replica's sync")
        self.dir.mkdir()
        for port in self.sentinel_ports:
            conf = Path(self.dir, f"sentinel-{port}.conf")
            # failover-timeout 60 s: the sentinels leave a replica pointed elsewhere (the
            # failover fault's held-back replica) alone for that long
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SENTINEL_NAME} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_NAME} {self.DOWN_AFTER}\n"
                f"sentinel failover-timeout {SENTINEL_NAME} 60000\n"
                f"sentinel parallel-syncs {SENTINEL_NAME} 1\n"
            )
            log = Path(self.dir, f"sentinel-{port}.log").open("ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen([master.exe, str(conf), "--sentinel"], stdout=log, stderr=log)
            )
            log.close()
        want = f"slaves=1,sentinels={len(self.sentinel_ports)}"
        self._wait(lambda: all(_info(p, want) for p in self.sentinel_ports), "the sentinels")

    def _wait(self, ok: Callable[[], bool], what: str, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"sentinel topology: {what} did not happen in {within} s\n{self.logs()}"
                )
            time.sleep(0.05)

    def logs(self, tail: int = 15) -> str:
        """The last lines of every server's and sentinel's log (a failover that failed)."""
        paths = [Path(n.dir, "redis.log") for n in self.nodes]
        paths += [Path(self.dir, f"sentinel-{p}.log") for p in self.sentinel_ports]
        out = []
        for path in paths:
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"== {path}\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for node in self.nodes:
            node.close()

    def conn(self, role: str) -> Conn:
        return {"kind": "sentinel", "name": SENTINEL_NAME,
                "sentinels": [["127.0.0.1", p] for p in self.sentinel_ports]}  # fmt: skip

    def admin(self) -> Any:
        return redis.Redis(port=self.nodes[self.master].port, decode_responses=True)

    def _discovered(self) -> int | None:
        """The master's port as a majority of the sentinels see it."""
        ports = []
        for p in self.sentinel_ports:
            with (
                contextlib.suppress(redis.RedisError),
                redis.Redis(port=p, socket_timeout=1.0) as s,
            ):
                addr = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_NAME)
                if addr:
                    ports.append(int(addr[1]))
        best = max(set(ports), key=ports.count, default=None)
        return best if best is not None and ports.count(best) >= 2 else None

    def _settled(self) -> bool:
        """Every sentinel names the current master and flags it neither down nor failing over."""
        port = self.nodes[self.master].port
        for p in self.sentinel_ports:
            try:
                with redis.Redis(port=p, socket_timeout=1.0, decode_responses=True) as s:
                    state = s.execute_command("SENTINEL", "MASTER", SENTINEL_NAME)
            except redis.RedisError:
                return False
            if isinstance(state, list):  # RESP2: a flat list of names and values
                state = dict(zip(state[::2], state[1::2], strict=True))
            if int(state["port"]) != port or state["flags"] != "master":
                return False
        return True

    def inject(self, kind: str, seconds: float, record: Record, ctx: dict[str, Any]) -> None:
        if kind != "failover":
            super().inject(kind, seconds, record, ctx)
            return
        old, new = self.nodes[self.master], self.nodes[1 - self.master]
        # 1. hold back replication: the replica keeps its data and follows a master that is not
        # there; the writes of the next ``seconds`` land on the master only
        with redis.Redis(port=new.port) as c:
            c.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        time.sleep(seconds)
        # 2. the master crashes; the sentinels promote the replica, which missed those writes
        # (how many bytes of the replication stream: in the fault's record)
        offsets = []
        for node, field in ((old, "master_repl_offset"), (new, "slave_repl_offset")):
            with redis.Redis(port=node.port, socket_timeout=2.0) as c:
                offsets.append(int(c.info("replication").get(field, 0)))
        ctx["fields"] = {"missed_bytes": offsets[0] - offsets[1]}
        ctx["t"] = time.monotonic()
        old.stop()
        self._wait(lambda: self._discovered() == new.port, "the failover", within=60.0)
        self.master = 1 - self.master
        record("failover", "redis")
        # 3. once every sentinel sees the new master up (with no replica to promote meanwhile:
        # no second failover), the old master comes back empty, as the new master's replica
        self._wait(self._settled, "the sentinels' agreement on the new master", within=60.0)
        old.args = [*self.ARGS, "--replicaof", "127.0.0.1", str(new.port)]
        old.restart()
        self._wait(lambda: _info(old.port, "master_link_status:up"), "the new replica's sync")


class ClusterTopology(Topology):
    """A 3-master cluster, no replicas."""

    name = "cluster"
    faults = frozenset({"migrate"})

    def __init__(self) -> None:
        self.cluster = LocalCluster(masters=3, replicas=0)

    def start(self) -> None:
        self.cluster.start()

    def close(self) -> None:
        self.cluster.close()

    def conn(self, role: str) -> Conn:
        return {"kind": "cluster", "url": self.cluster.url}

    def admin(self) -> Any:
        return RedisCluster.from_url(self.cluster.url, decode_responses=True)

    def inject(self, kind: str, seconds: float, record: Record, ctx: dict[str, Any]) -> None:
        if kind != "migrate":
            super().inject(kind, seconds, record, ctx)
            return
        job = ctx["job"]  # the current job of the fault's worker (or its last one)
        with RedisCluster.from_url(self.cluster.url) as client:
            key = KeySchema(ctx["ns"]).state(job)
            slot = client.keyslot(key)
            src = client.get_node_from_key(key)
            dst = next(n for n in client.get_primaries() if n.name != src.name)
            admin = {n.name: redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()}
        try:
            ids = {name: r.execute_command("CLUSTER", "MYID").decode() for name, r in admin.items()}
            # destination first, then source, then the others (as redis-cli does)
            admin[dst.name].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src.name])
            admin[src.name].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst.name])
            while names := admin[src.name].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                admin[src.name].execute_command(
                    "MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *names
                )
            time.sleep(seconds)  # held MIGRATING / IMPORTING: asked over (ASK)
            while names := admin[src.name].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                admin[src.name].execute_command(  # created meanwhile by a command not asked
                    "MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *names
                )
            for name in [dst.name, src.name, *(n for n in admin if n not in (dst.name, src.name))]:
                admin[name].execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst.name])
            record("migrate", f"slot {slot}: {src.name} -> {dst.name}")
        finally:
            for r in admin.values():
                r.close()


TOPOLOGIES: dict[str, type[Topology]] = {
    "single": Single,
    "sentinel": SentinelTopology,
    "cluster": ClusterTopology,
}
ORDER = tuple(TOPOLOGIES)  # the seed picks one: ORDER[seed % 3]


def for_seed(seed: int) -> str:
    """The topology a seed runs when none is named: ``ORDER[seed % 3]``."""
    return ORDER[seed % len(ORDER)]


_info = _info_has  # True when INFO of the server (or sentinel) at a port holds a string
