"""Fixtures shared by the integration tests (the Redis server and ``ns``: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis


@pytest.fixture
def sync_client(redis_url: str, ns: str) -> Iterator[redis.Redis]:
    """A blocking client of the test server; the test's keys (``ns:*``) are deleted after it."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2.0)
    try:
        yield client
    finally:
        for key in client.scan_iter(match=f"{ns}:*", count=1000):
            client.delete(key)
        client.close()
