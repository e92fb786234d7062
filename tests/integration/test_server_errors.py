"""Error classification (jobpulse._protocol.errors) against the real replies of Redis and Valkey.

Each error is produced by a real server of each binary (whatever ``JOBPULSE_TEST_SERVER`` says):
the texts differ between them (Valkey 8 and 9 reworded NOSCRIPT, BUSY and script errors), the
codes do not, and jobpulse decides on the codes.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis._parsers import BaseParser
from redis.exceptions import ResponseError

from jobpulse._protocol.errors import (
    error_code,
    is_no_such_key,
    is_noscript,
    is_redirect,
    is_transient,
    is_unknown_command,
    is_wrongtype,
    refuses_blocking,
)
from jobpulse._provision import RedisServer, free_cluster_port

from ..support import eventually


@pytest.fixture(scope="module", params=["redis", "valkey"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(kind: str) -> Iterator[RedisServer]:
    """A private server of each binary (shared by this module: the tests reconfigure nothing
    they do not restore)."""
    with RedisServer(server=kind, args=["--busy-reply-threshold", "50"]) as s:
        yield s


@pytest.fixture
async def r(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url)
    await client.set("str", "x")
    try:
        yield client
    finally:
        await client.aclose()


async def error_of(call: Any) -> Exception:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the classification is the check
        await call
    return caught.value  # type: ignore[return-value]


async def test_wrongtype_direct_in_a_pipeline_and_from_a_script(r: aioredis.Redis) -> None:
    direct = await error_of(r.hget("str", "f"))
    scripted = await error_of(r.eval("return redis.call('HGET', KEYS[1], 'f')", 1, "str"))
    async with r.pipeline(transaction=False) as pipe:
        replies = await pipe.xread({"str": "0-0"}).execute(raise_on_error=False)
    for exc in (direct, scripted, replies[0]):
        assert error_code(exc) == "WRONGTYPE"
        assert is_wrongtype(exc)
        assert not is_transient(exc)
        assert not refuses_blocking(exc)


async def test_no_such_key(r: aioredis.Redis) -> None:
    for exc in (await error_of(r.xinfo_stream("none")), await error_of(r.rename("none", "x"))):
        assert error_code(exc) == "ERR"
        assert is_no_such_key(exc)
        assert not is_unknown_command(exc)
    other_err = await error_of(r.execute_command("SET", "a", "b", "NOSUCHOPTION"))  # syntax error
    assert error_code(other_err) == "ERR"
    assert not is_no_such_key(other_err)


async def test_noscript(r: aioredis.Redis) -> None:
    exc = await error_of(r.evalsha("0" * 40, 0))
    assert error_code(exc) == "NOSCRIPT"
    assert is_noscript(exc)


async def test_unknown_command_direct_and_from_a_script(r: aioredis.Redis) -> None:
    direct = await error_of(r.execute_command("NOSUCHCOMMAND", "a"))
    scripted = await error_of(r.eval("return redis.call('NOSUCHCOMMAND')", 0))
    for exc in (direct, scripted):
        assert error_code(exc) == "ERR"
        assert is_unknown_command(exc)
        assert not is_no_such_key(exc)


async def test_readonly_on_a_replica(kind: str, server: RedisServer) -> None:
    with RedisServer(server=kind) as replica:
        client = aioredis.Redis.from_url(replica.url)
        try:
            await client.execute_command("REPLICAOF", "127.0.0.1", str(server.port))
            exc = await error_of(client.set("k", "v"))
        finally:
            await client.aclose()
    assert error_code(exc) == "READONLY"
    assert is_transient(exc)
    assert not refuses_blocking(exc)


async def test_oom_under_maxmemory_noeviction(r: aioredis.Redis) -> None:
    await r.config_set("maxmemory-policy", "noeviction")
    await r.config_set("maxmemory", "1")
    try:
        direct = await error_of(r.set("k", "v"))
        scripted = await error_of(r.eval("return redis.call('SET', KEYS[1], 'v')", 1, "k"))
    finally:
        await r.config_set("maxmemory", "0")
    for exc in (direct, scripted):
        assert error_code(exc) == "OOM"
        assert is_transient(exc)


async def test_noperm(server: RedisServer, r: aioredis.Redis) -> None:
    await r.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], commands=["+ping"])
    limited = aioredis.Redis(host="127.0.0.1", port=server.port, username="limited", password="pw")
    try:
        exc = await error_of(limited.get("k"))
    finally:
        await limited.aclose()
        await r.acl_deluser("limited")
    assert error_code(exc) == "NOPERM"
    assert not refuses_blocking(exc)  # an ACL refusing XREAD refuses it without BLOCK too
    assert not is_transient(exc)


def test_busy_while_a_script_runs(server: RedisServer) -> None:
    """A script running past busy-reply-threshold: other clients get BUSY until it ends."""
    spin = """
        local t0 = redis.call('TIME')
        while true do
            local t = redis.call('TIME')
            if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1500000 then return 1 end
        end"""
    runner = redis.Redis.from_url(server.url)
    probe = redis.Redis.from_url(server.url)
    thread = threading.Thread(target=runner.eval, args=(spin, 0))
    thread.start()
    try:

        def busy() -> Exception | None:
            try:
                probe.ping()
            except ResponseError as exc:
                return exc
            return None

        # Probe for as long as the script may run, not a number of times: on a loaded machine
        # 300 PINGs could all be answered before the runner thread even sent its EVAL.
        exc = None
        while exc is None and thread.is_alive():
            exc = busy()
    finally:
        thread.join(10)
        runner.close()
        probe.close()
    assert exc is not None
    assert error_code(exc) == "BUSY"
    assert is_transient(exc)


async def test_moved_and_ask_between_two_cluster_nodes(kind: str) -> None:
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    # a cluster node also binds port + 10000 (its bus): take ports whose bus port is free too
    with (
        RedisServer(server=kind, pick_port=free_cluster_port, args=args) as a,
        RedisServer(server=kind, pick_port=free_cluster_port, args=args) as b,
    ):
        ca, cb = aioredis.Redis.from_url(a.url), aioredis.Redis.from_url(b.url)
        try:
            await ca.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "8191")
            await cb.execute_command("CLUSTER", "ADDSLOTSRANGE", "8192", "16383")
            await ca.execute_command("CLUSTER", "MEET", "127.0.0.1", str(b.port))

            async def agreed() -> bool:  # both see every slot covered: cluster_state:ok
                infos = [await c.execute_command("CLUSTER", "INFO") for c in (ca, cb)]
                return all(b"cluster_state:ok" in i for i in infos)

            await eventually(agreed, within=10)
            key = "b"  # slot 3300: served by a
            assert int(await ca.execute_command("CLUSTER", "KEYSLOT", key)) < 8192
            moved = await error_of(cb.get(key))
            b_id = (await cb.execute_command("CLUSTER", "MYID")).decode()
            slot = await ca.execute_command("CLUSTER", "KEYSLOT", key)
            await ca.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", b_id)
            ask = await error_of(ca.get(key))  # not here and migrating: ASK
        finally:
            await ca.aclose()
            await cb.aclose()
    assert error_code(moved) == "MOVED"
    assert error_code(ask) == "ASK"
    for exc in (moved, ask):
        assert is_redirect(exc)
        assert is_transient(exc)


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        ("LOADING Redis is loading the dataset in memory", "LOADING"),
        ("LOADING Valkey is loading the dataset in memory", "LOADING"),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
         "MASTERDOWN"),
        ("TRYAGAIN Multiple keys request during rehashing of slot", "TRYAGAIN"),
        ("ERR EXEC without MULTI", "ERR"),
        ("BUSYGROUP Consumer Group name already exists", "BUSYGROUP"),
    ],
)  # fmt: skip
def test_codes_of_replies_hard_to_provoke_as_redis_py_parses_them(reply: str, code: str) -> None:
    """LOADING and MASTERDOWN need a big dataset or a broken link: checked on the error objects
    redis-py's own parser makes of the servers' texts (no server involved)."""
    exc = BaseParser.parse_error(reply)
    assert error_code(exc) == code
