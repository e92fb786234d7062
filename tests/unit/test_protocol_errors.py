"""The one boundary that interprets redis-py's exceptions."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from jobpulse._protocol.errors import is_redis_fault


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
