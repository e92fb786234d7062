"""Fixtures of the fault suite: a private Redis behind a fault proxy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from jobpulse._provision import RedisServer

from .proxy import FaultProxy


@dataclass
class Proxied:
    server: RedisServer
    proxy: FaultProxy
    via_proxy: aioredis.Redis  # what the code under test uses
    direct: aioredis.Redis  # what the test looks through: never delayed, never cut


@pytest.fixture
async def proxied(private_redis: RedisServer) -> AsyncIterator[Proxied]:
    with FaultProxy(private_redis.port) as proxy:
        via = aioredis.Redis.from_url(proxy.url)
        direct = aioredis.Redis.from_url(private_redis.url)
        try:
            yield Proxied(private_redis, proxy, via, direct)
        finally:
            proxy.blackhole = False
            proxy.latency = 0.0
            await via.aclose()
            await direct.aclose()
