"""Client factories for the sidecar helper (``client_factory=``): module-level, so the helper
process can load them by module path."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel


def sentinel_master(addresses: tuple[tuple[str, int], ...], name: str) -> aioredis.Redis:
    """The master of ``name`` through the Sentinels at ``addresses`` (asyncio)."""
    sentinel = Sentinel(list(addresses), socket_timeout=1.0)
    client: Any = sentinel.master_for(name, socket_timeout=2.0)
    return client  # type: ignore[no-any-return]


def cluster(url: str) -> RedisCluster:
    """An asyncio Cluster client from one node's URL."""
    return RedisCluster.from_url(url)
