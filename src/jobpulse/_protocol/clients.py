"""The Redis clients jobpulse accepts, as type aliases (the protocol package owns redis)."""

from __future__ import annotations

from typing import TypeAlias

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

__all__ = ["AsyncClient", "SyncClient"]

AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
"""An asyncio client: ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
"""A blocking client: ``redis.Redis`` or ``redis.cluster.RedisCluster``."""
