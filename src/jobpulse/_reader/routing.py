"""The watch hub: routes each watched stream to the XREAD loop of the server that holds it.

On a single Redis there is one loop, on the reader's own client: one dedicated connection for
every watcher of every job. On a Redis Cluster the streams are grouped by the master that owns
their hash slot, with one :class:`~.xread.XReadLoop` (one dedicated connection) per master,
built from the node's host and port and the cluster client's connection settings (password,
username, TLS, ``decode_responses``, timeouts...). When a node's XREAD answers MOVED (the slot
moved: resharding, failover), CLUSTERDOWN, or fails on the connection (the node is gone), the
hub refreshes the cluster client's slot map and moves each stream, with its watchers and its
cursor, to the loop of its new owner; nothing is lost since the cursor travels with it. ASK and
TRYAGAIN (a slot being migrated) make the node's loop poll through the cluster client, which
follows ASK, until the migration is over. A server that refuses ``XREAD … BLOCK`` (Upstash) makes
its loop, and every loop the hub creates after it, poll on a ``Backoff`` schedule instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster

from .._protocol.codec import parse_stream_id
from .._protocol.errors import tolerate_faults
from .._protocol.keys import KeySchema
from .hubtypes import HubStatistics, Stream, Watcher
from .xread import XReadLoop

__all__ = ["WatchHub"]

log = logging.getLogger("jobpulse")

_NODE_CONNECTIONS = 4
"""Connections per node client of a cluster hub: the XREAD one, CLIENT UNBLOCK, a poll pipeline."""


class WatchHub:
    """One reader's shared XREAD loops. Created by :class:`StatusReader`; not public.

    Args:
        redis: the reader's client (``redis.asyncio.Redis`` or ``RedisCluster``).
        schema: key names.
        block: XREAD BLOCK timeout in seconds (kept under the client's socket timeout).
        poll: on a cluster, seconds between polls of a node whose streams span several slots.
        liveness_interval: seconds between liveness checks of the followed jobs.
        queue_size: events buffered per watcher before it is dropped to resync.
        slots: bounds the reader's calls in flight on the client's pool (history reads).
        count: XREAD COUNT per stream and call.
        clock: monotonic clock.
        blocking: False: never send ``XREAD … BLOCK``, poll (servers without blocking reads);
            True: block, and poll once a server refused to block.
        poll_cap: when polling without blocking reads, the longest pause between empty reads.
    """

    def __init__(
        self,
        redis: Any,
        schema: KeySchema,
        *,
        block: float,
        liveness_interval: float,
        queue_size: int,
        slots: asyncio.Semaphore,
        poll: float = 0.1,
        count: int = 100,
        clock: Callable[[], float] = time.monotonic,
        blocking: bool = True,
        poll_cap: float = 2.0,
    ) -> None:
        self._redis = redis
        self.blocking, self._poll_cap = blocking, poll_cap
        self._schema = schema
        self._cluster = isinstance(redis, RedisCluster)
        self._block, self._poll, self._interval = block, poll, liveness_interval
        self._count, self._clock = count, clock
        self.queue_size = queue_size
        self.slots = slots
        self._streams: dict[str, Stream] = {}
        self._loops: dict[str, XReadLoop] = {}
        self._retired = {"xreads": 0, "unblocks": 0, "checks": 0, "overflows": 0, "reroutes": 0}
        self._reroute_lock = asyncio.Lock()
        self._closed = False

    def statistics(self) -> HubStatistics:
        loops = list(self._loops.values())

        def total(name: str) -> int:
            return self._retired[name] + sum(int(getattr(loop, name)) for loop in loops)

        watchers = sum(len(s.watchers) for s in self._streams.values())
        return HubStatistics(
            len(self._streams), watchers, total("xreads"), total("unblocks"), total("checks"),
            total("overflows"), len(loops), total("reroutes"),
        )  # fmt: skip

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<WatchHub streams={s.streams} watchers={s.watchers} xreads={s.xreads}"
            f" loops={s.loops}>"
        )

    # -- attach and detach (synchronous: no await may split them) -----------------------------

    def attach(self, watcher: Watcher, job_id: str, last_id: str) -> str | None:
        """Attach ``watcher`` to the job's stream; it has read every entry up to ``last_id``.

        Returns:
            The hub's cursor when it is ahead of ``last_id`` (the watcher reads up to it with
            XRANGE), else None.

        Raises:
            RuntimeError: the reader is closed.
            redis.exceptions.RedisClusterException: the job's slot is not covered (a cluster
                that is down); the watcher falls back like on any Redis fault.
        """
        if self._closed:
            raise RuntimeError("the StatusReader is closed")
        keys = self._schema.job(job_id)
        stream = self._streams.get(keys.events)
        ahead = None
        if stream is None:
            loop = self._loop_for(keys.events)
            slot = self._redis.keyslot(keys.events) if self._cluster else 0
            stream = Stream(keys.events, keys.state, keys.alive, last_id, set(), slot)
            self._streams[keys.events] = stream
            loop.add(stream)
        elif parse_stream_id(stream.cursor) > parse_stream_id(last_id):
            ahead = stream.cursor
        stream.watchers.add(watcher)
        watcher.stream = stream
        watcher.overflowed = False
        if stream.loop is not None:
            stream.loop.wake(stream)
        return ahead

    def detach(self, watcher: Watcher) -> None:
        stream, watcher.stream = watcher.stream, None
        if stream is not None:
            stream.watchers.discard(watcher)
            if not stream.watchers:
                self.drop(stream)

    def drop(self, stream: Stream) -> None:
        """Stop following ``stream`` (no watcher left, or it ended)."""
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]
        if stream.loop is not None:
            stream.loop.discard(stream)

    # -- routing -------------------------------------------------------------------------------

    def _loop_for(self, key: str) -> XReadLoop:
        if not self._cluster:
            name, node = "", self._redis
        else:
            owner = self._redis.get_node_from_key(key)
            name, node = owner.name, None
        loop = self._loops.get(name)
        if loop is None or loop.closed:
            if node is None:
                node = _node_client(owner)
            loop = XReadLoop(
                self, node, self._redis, name=name, block=self._block, poll=self._poll,
                liveness_interval=self._interval, count=self._count, clock=self._clock,
                blocking=self.blocking, poll_cap=self._poll_cap,
            )  # fmt: skip
            self._loops[name] = loop
        return loop

    async def reroute(self, loop: XReadLoop) -> None:
        """Refresh the cluster's slot map and move ``loop``'s streams to their owners' loops."""
        if not self._cluster:
            return
        async with self._reroute_lock:
            failed: list[BaseException] = []
            with tolerate_faults(failed.append):
                await self._redis.nodes_manager.initialize()
            if failed:
                log.warning("jobpulse watch: cluster slot refresh failed: %r", failed[0])
                return
            for stream in list(loop.streams.values()):
                target: XReadLoop | None = None
                with tolerate_faults(lambda _: None):
                    target = self._loop_for(stream.key)
                if target is None:
                    continue  # the slot is not covered yet (failover in progress): stay
                if target is not loop:
                    loop.discard(stream)
                    target.add(stream)
            current = {node.name for node in self._redis.get_primaries()}
            for name, idle in list(self._loops.items()):
                if not idle.streams and name not in current:
                    await self._retire(name, idle, wait=idle is not loop)

    async def _retire(self, name: str, loop: XReadLoop, *, wait: bool) -> None:
        del self._loops[name]
        for key in self._retired:
            self._retired[key] += getattr(loop, key)
        loop.closed = True
        if wait:
            await loop.aclose()
        await loop.close_node()

    async def aclose(self) -> None:
        """Stop the loops; attached watchers raise ``RuntimeError`` once they drained."""
        self._closed = True
        error = RuntimeError("the StatusReader was closed")
        for stream in list(self._streams.values()):
            for watcher in list(stream.watchers):
                watcher.fail(error)
        self._streams.clear()
        for name, loop in list(self._loops.items()):
            loop.streams.clear()
            await self._retire(name, loop, wait=True)


def _node_client(node: Any) -> Redis:
    """A plain client of one cluster node, with the cluster client's connection settings."""
    kwargs = dict(node.connection_kwargs)
    pool = ConnectionPool(
        connection_class=node.connection_class, max_connections=_NODE_CONNECTIONS, **kwargs
    )
    return Redis.from_pool(pool)
