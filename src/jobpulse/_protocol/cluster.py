"""Commands on an asyncio Redis Cluster, following ASK on one connection.

While a hash slot is being moved (``CLUSTER SETSLOT … MIGRATING``/``IMPORTING``), its old
owner answers ``-ASK <slot> <host:port>`` for keys it no longer holds; the client must send
``ASKING`` and then the command *on the same connection* of the importing node. redis-py's
asyncio ``RedisCluster`` (8.1) sends ``ASKING`` on one pooled connection of that node and the
command on the oldest free one; when the node has two or more free connections they differ,
the importing node answers MOVED back to the old owner, and after 16 redirections the command
fails with ``ClusterError: TTL exhausted``. A slot held MIGRATING for about ``ttl`` would then
cost a job its lease (docs/scaling.md, "Resharding").

So every asyncio cluster call of jobpulse goes through :func:`execute`: redis-py's cluster
pipeline routes the commands and retries connection faults, with its own redirection turned
off; jobpulse then follows what came back itself, at most ``RedisClusterRequestTTL`` (16)
rounds, as redis-py's command path would:

* ASK: ``ASKING`` and the command, packed into one write on one connection of the importing
  node (all the commands asked over to a node share that write, each after its own
  ``ASKING``);
* MOVED: the command alone through ``RedisCluster.execute_command``, which learns the new slot
  owner (the slot has moved: it is no longer migrating, and ASK is no longer answered);
* a connection fault or timeout (the pipeline leaves it in place): the command alone through
  ``RedisCluster.execute_command`` too, once, for the client's ``Retry`` and slot refresh
  (every jobpulse command is safe to replay: docs/reliability.md);
* TRYAGAIN (a multi-key command whose keys are split during the move): sent again the same
  way after 50 ms.

A redirected command was not run where it was refused, so following it never runs it twice.
The blocking ``redis.cluster.RedisCluster`` sends ``ASKING`` and the command on one connection
and keeps its own path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio.cluster
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    RedisError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

__all__ = ["execute", "is_async_cluster", "pipelined"]

_NO_OPTIONS: Mapping[str, Any] = {}
TRYAGAIN_PAUSE = 0.05
"""Seconds before a command answered TRYAGAIN is sent again (redis-py's pause)."""


def is_async_cluster(client: Any) -> bool:
    """True for an asyncio ``RedisCluster``."""
    return isinstance(client, redis.asyncio.cluster.RedisCluster)


async def pipelined(
    client: Any,
    commands: Sequence[Sequence[Any]],
    options: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """Send ``commands`` in one round trip (per node) and return their replies, error replies
    in their place (``pipe.execute(raise_on_error=False)``'s shape): on an asyncio cluster
    through :func:`execute`, on any other asyncio client through redis-py's pipeline.
    ``options``: each command's ``execute_command`` keyword arguments (``target_nodes``)."""
    if is_async_cluster(client):
        return await execute(client, commands, options)
    async with client.pipeline(transaction=False) as pipe:
        for args, kwargs in zip(commands, options or [_NO_OPTIONS] * len(commands), strict=True):
            pipe.execute_command(*args, **kwargs)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    return replies


async def execute(
    cluster: redis.asyncio.cluster.RedisCluster,
    commands: Sequence[Sequence[Any]],
    options: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """Send ``commands`` on ``cluster`` and follow ASK, MOVED, TRYAGAIN and a command's
    connection fault as the module says; the replies in order, error replies in their place
    (a redirection still unresolved after 16 rounds; a fault the retry did not cure). A fault
    of the whole pipeline that redis-py's own retries did not cure is raised."""
    opts = list(options) if options is not None else [_NO_OPTIONS] * len(commands)
    if len(opts) != len(commands):
        raise ValueError(f"{len(commands)} commands but {len(opts)} option mappings")
    replies = await _routed(cluster, list(range(len(commands))), commands, opts)
    asked: dict[int, Any] = {}  # command index -> the node that asked for it (ASK, TRYAGAIN)
    delegated: set[int] = set()  # sent through redis-py's command path after a fault
    for _ in range(cluster.RedisClusterRequestTTL):
        routed: list[int] = []
        ask: dict[str, tuple[Any, list[int]]] = {}
        fallback: list[int] = []
        pause = False
        for i, reply in enumerate(replies):
            if isinstance(reply, MovedError):  # (a subclass of AskError: test it first)
                asked.pop(i, None)
                fallback.append(i)
            elif isinstance(reply, AskError):
                node = cluster.get_node(host=reply.host, port=reply.port)
                if node is None:  # a node the slot map does not know yet: redis-py's path
                    fallback.append(i)
                    continue
                asked[i] = node
                ask.setdefault(node.name, (node, []))[1].append(i)
            elif isinstance(reply, TryAgainError):
                pause = True
                if i in asked:
                    ask.setdefault(asked[i].name, (asked[i], []))[1].append(i)
                else:
                    routed.append(i)
            elif isinstance(reply, ConnectionError | TimeoutError) and i not in delegated:
                # The pipeline leaves a connection fault in place; redis-py's command path
                # retries it (the client's Retry) and refreshes the slot map, as a command
                # sent alone would be. Once: a second fault is the reply.
                delegated.add(i)
                fallback.append(i)
        if not (routed or ask or fallback):
            break
        if pause:
            await asyncio.sleep(TRYAGAIN_PAUSE)
        if routed:
            again = await _routed(cluster, routed, commands, opts)
            for i, reply in zip(routed, again, strict=True):
                replies[i] = reply
        for node, indexes in ask.values():
            try:
                answers = await _asking(node, indexes, commands, opts)
            except (ConnectionError, TimeoutError) as exc:
                answers = [exc] * len(indexes)
            for i, reply in zip(indexes, answers, strict=True):
                replies[i] = reply
        for i in fallback:
            try:
                replies[i] = await cluster.execute_command(*commands[i], **opts[i])
            except RedisError as exc:
                replies[i] = exc
    return replies


async def _routed(
    cluster: redis.asyncio.cluster.RedisCluster,
    indexes: Sequence[int],
    commands: Sequence[Sequence[Any]],
    opts: Sequence[Mapping[str, Any]],
) -> list[Any]:
    """The commands at ``indexes`` through redis-py's cluster pipeline, redirections left in
    place as replies."""
    pipe = cluster.pipeline(transaction=False)
    for i in indexes:
        pipe.execute_command(*commands[i], **opts[i])
    replies: list[Any] = await pipe.execute(raise_on_error=False, allow_redirections=False)
    return replies


async def _asking(
    node: Any,
    indexes: Sequence[int],
    commands: Sequence[Sequence[Any]],
    opts: Sequence[Mapping[str, Any]],
) -> list[Any]:
    """``ASKING`` and each command at ``indexes``, all in one write on one connection of
    ``node`` (the importing one); the commands' replies, error replies in their place. A
    connection that fails or is cancelled mid-way is closed before it goes back to the pool,
    so no later command reads a stale reply."""
    conn = node.acquire_connection()
    try:
        reconnect = getattr(node, "disconnect_if_needed", None)  # redis-py 7+: a lazy reconnect
        if reconnect is not None:
            await reconnect(conn)
        wanted: list[Sequence[Any]] = []
        for i in indexes:
            wanted += [("ASKING",), commands[i]]
        await conn.send_packed_command(conn.pack_commands(wanted))
        replies: list[Any] = []
        for i in indexes:
            # ASKING answers OK on a cluster node; were it refused, the command's own reply
            # (MOVED, most likely) says what to do next.
            with contextlib.suppress(ResponseError):
                await conn.read_response()
            kwargs = {k: v for k, v in opts[i].items() if k != "target_nodes"}
            try:
                replies.append(await node.parse_response(conn, commands[i][0], **kwargs))
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await asyncio.shield(conn.disconnect())
        raise
    finally:
        release = getattr(node, "release", None)
        if release is not None:
            release(conn)
        else:  # redis-py before 5.1: the node has no release()
            node._free.append(conn)
