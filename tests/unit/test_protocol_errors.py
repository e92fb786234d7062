"""The one boundary that interprets redis-py's exceptions."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError, RedisClusterException

from jobpulse._protocol.errors import is_redis_fault
from jobpulse._provision import free_port


async def test_a_connection_closed_under_a_command_is_a_redis_fault() -> None:
    """redis-py's cluster client disconnects connections other tasks are using (its aclose()
    after repeated MOVED); the command in flight then fails with an AttributeError inside
    redis-py. That is a lost connection, not a bug of the caller."""
    conn = Connection(host="127.0.0.1", port=1)  # never connected: its writer is None
    with pytest.raises(AttributeError) as info:
        await conn._send_packed_command([b"PING\r\n"])
    assert is_redis_fault(info.value)
    with pytest.raises(AttributeError) as other:
        None.writelines  # type: ignore[attr-defined]  # noqa: B018 - ours, not redis-py's
    assert not is_redis_fault(other.value)


async def _cluster_refresh_error(url: str) -> BaseException:
    client = RedisCluster.from_url(url)
    with pytest.raises(RedisClusterException) as info:
        await client.initialize()  # the slot refresh (nodes_manager.initialize()); closes all
    return info.value


async def test_a_cluster_refresh_that_reached_no_node_is_a_redis_fault() -> None:
    """redis-py's cluster client raises ``RedisClusterException`` (not a ``RedisError``) when
    no startup node answered its slot refresh, ``from`` the last node's error. A watch that
    refreshed the slot map after MOVED during a resharding met it, caused by a connection that
    redis-py's own ``aclose()`` closed under the refresh, and its hub crashed: the failure is a
    Redis fault when its cause is one (here: nobody listens on the port)."""
    error = await _cluster_refresh_error(f"redis://127.0.0.1:{free_port()}")
    assert "cannot be connected" in str(error)
    assert isinstance(error.__cause__, ConnectionError)
    assert is_redis_fault(error)

    conn = Connection(host="127.0.0.1", port=1)  # the resharding case: a writer set to None
    with pytest.raises(AttributeError) as closed:
        await conn._send_packed_command([b"PING\r\n"])
    try:
        raise RedisClusterException("Redis Cluster cannot be connected.") from closed.value
    except RedisClusterException as wrapped:
        assert is_redis_fault(wrapped)


async def test_a_cluster_client_on_a_server_without_cluster_mode_is_not_a_redis_fault(
    redis_url: str,
) -> None:
    """The same exception caused by a server that is not a cluster is a configuration error:
    retrying cannot help, so it propagates."""
    error = await _cluster_refresh_error(redis_url)
    assert isinstance(error.__cause__, RedisClusterException)
    assert "Cluster mode is not enabled" in str(error.__cause__)
    assert not is_redis_fault(error)
