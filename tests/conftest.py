"""Real Redis for every test that touches Redis.

Where the server comes from: ``REDIS_URL`` if set; else, when ``JOBPULSE_TEST_SERVER`` names a
server (``redis`` or ``valkey``), a private server of that binary on a free port; else a Redis
container through testcontainers when a Docker engine answers; else a private ``redis-server``.
Each test gets its own namespace. Destructive tests take ``private_redis``, a server of their own,
and the cluster tests a ``LocalCluster``: both run the ``JOBPULSE_TEST_SERVER`` binary (default
``redis``), so ``JOBPULSE_TEST_SERVER=valkey`` moves the whole suite but ``REDIS_URL`` to Valkey.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from jobpulse._provision import SERVER_ENV, LocalCluster, RedisServer, _docker_answers

ALONE_ENV = "JOBPULSE_ALONE"
"""Set (to 1) to run the tests marked ``alone``: they need the machine to themselves, so the
xdist suite skips them and CI runs them in a step of their own (.ci/run)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ALONE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"needs the machine to itself: run with {ALONE_ENV}=1")
    for item in items:
        if item.get_closest_marker("alone") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    if os.environ.get(SERVER_ENV):
        with RedisServer() as server:
            yield server.url
        return
    if _docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as c:
            yield f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}/0"
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"t{secrets.token_hex(5)}"


@pytest.fixture
async def redis(redis_url: str, ns: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await _clean(client, ns)
        await client.aclose()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster (3 masters, 1 replica each) on loopback, shared by the session."""
    with LocalCluster() as cluster:
        yield cluster


async def _clean(client: aioredis.Redis | RedisCluster, ns: str) -> None:
    with contextlib.suppress(Exception):
        keys = [k async for k in client.scan_iter(match=f"{ns}:*", count=1000)]
        for key in keys:
            await client.delete(key)


@pytest.fixture(params=["single", "cluster"])
async def client(
    request: pytest.FixtureRequest, redis_url: str, ns: str
) -> AsyncIterator[aioredis.Redis | RedisCluster]:
    """The test runs twice: on a single Redis and on a real Redis Cluster."""
    if request.param == "single":
        c: aioredis.Redis | RedisCluster = aioredis.Redis.from_url(redis_url)
    else:
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        c = RedisCluster.from_url(cluster.url)
        await c.initialize()
    try:
        yield c
    finally:
        await _clean(c, ns)
        await c.aclose()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may stop, restart or reconfigure."""
    with RedisServer() as server:
        yield server


# -- resources a test left open ---------------------------------------------------------------

_LEFT_OPEN: list[str] = []


@pytest.fixture(autouse=True)
def _collect_own_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect the test's cyclic garbage at its own teardown and name what it left open.

    A resource left open inside a reference cycle (a ``redis.asyncio`` connection in an event
    loop that closed) warns from its finalizer only when the collector runs, in whichever later
    test that happens: ``filterwarnings = error`` then failed an unrelated test (stop 32's CI:
    ``test_examples`` and the 10,000-job burst, a connection of some earlier test to the shared
    server). Here the collector runs at the end of every test and its finalizers' warnings are
    recorded against the test that made the garbage, and listed at the end of the run
    ("resources left open"), so the culprit is named instead of a bystander failing.
    """
    yield
    seen: list[str] = []
    hook = sys.unraisablehook

    def record(u: Any) -> None:
        seen.append(f"{type(u.exc_value).__name__}: {u.exc_value} (in {u.object!r})")

    sys.unraisablehook = record
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook
    for text in seen:
        request.node.user_properties.append(("left_open", text))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _LEFT_OPEN.extend(f"{report.nodeid}: {v}" for k, v in report.user_properties
                          if k == "left_open")  # fmt: skip


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LEFT_OPEN:
        terminalreporter.section("resources left open (finalizer warnings at the test's end)")
        for line in _LEFT_OPEN:
            terminalreporter.write_line(line)
