"""Bad input is refused with a clear error before any Redis command.

The client points at a port where nothing listens: any Redis command would raise
ConnectionError, so an InvalidJobId / ValueError / TypeError proves nothing was sent.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from jobpulse import InvalidJobId, heartbeat, request_cancel
from jobpulse._protocol.keys import KeySchema, check_job_id
from jobpulse._provision import free_port
from jobpulse._worker.config import check_stage


@pytest.fixture
async def nowhere() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=free_port(), socket_connect_timeout=0.2)
    yield client
    await client.aclose()


@pytest.mark.parametrize(
    "job_id",
    ["", "a" * 201, "has space", "brace{", "brace}", "tab\t", "nl\n", "é", None, 5, b"bytes"],
)
async def test_invalid_job_ids_raise_before_any_redis_call(
    nowhere: aioredis.Redis, job_id: object
) -> None:
    with pytest.raises(InvalidJobId, match="job id"):
        async with heartbeat(nowhere, job_id):  # type: ignore[arg-type]
            pass
    with pytest.raises(InvalidJobId):
        await request_cancel(nowhere, job_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("job_id", ["a", "a" * 200, "report:2024/11.csv_v-2", "A.Z_0-9:/x"])
def test_valid_job_ids(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"interval": 0}, ValueError, "interval"),
        ({"interval": -1}, ValueError, "interval"),
        ({"interval": math.nan}, ValueError, "interval"),
        ({"interval": "1"}, TypeError, "interval"),
        ({"interval": 1.0, "ttl": 1.9}, ValueError, "ttl"),
        ({"total": -1}, ValueError, "total"),
        ({"total": 1.5}, TypeError, "total"),
        ({"meta": {"x": object()}}, TypeError, "meta"),
        ({"meta": {"x": "y" * 70_000}}, ValueError, "meta"),
        ({"meta": {"x": "y" * 200}, "max_meta_bytes": 100}, ValueError, "meta"),
        ({"maxlen": 0}, ValueError, "maxlen"),
        ({"stream_every": 0}, ValueError, "stream_every"),
        ({"retention": 0}, ValueError, "retention"),
        ({"namespace": "a b"}, InvalidJobId, "namespace"),
        ({"namespace": "x{y}"}, InvalidJobId, "namespace"),
    ],
)
async def test_bad_options_name_the_field(
    nowhere: aioredis.Redis, options: dict[str, object], error: type[Exception], field: str
) -> None:
    with pytest.raises(error, match=field):
        async with heartbeat(nowhere, "job", **options):
            pass


@pytest.mark.parametrize("stage", ["", "x" * 201, "line\nbreak", 3])
def test_bad_stage_names(stage: object) -> None:
    with pytest.raises((ValueError, TypeError), match="stage"):
        check_stage(stage)


def test_keys_share_one_hash_tag_per_job() -> None:
    keys = KeySchema("ns").job("a:b/c")
    assert keys.all() == (
        "ns:{a:b/c}:state",
        "ns:{a:b/c}:events",
        "ns:{a:b/c}:alive",
        "ns:{a:b/c}:fence",
    )
    assert KeySchema("ns", index_shards=4).index_for("a:b/c").startswith("ns:{#running:")


@pytest.mark.parametrize(
    ("kind", "error"),
    [("has space", ValueError), ("k" * 101, ValueError), ("é", ValueError), (None, TypeError)],
)
async def test_invalid_kinds_raise_before_any_redis_call(
    nowhere: aioredis.Redis, kind: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="kind"):
        async with heartbeat(nowhere, "job", kind=kind):
            pass


@pytest.mark.parametrize(
    ("limit", "error"), [(0, ValueError), (-3, ValueError), ("5", TypeError), (True, TypeError)]
)
async def test_running_ids_refuses_a_bad_limit_like_every_int_option(
    nowhere: aioredis.Redis, limit: object, error: type[Exception]
) -> None:
    """The one int check (``_checks.check_number``): TypeError for what is not an int,
    ValueError below 1, as the reader's own int options answer."""
    from jobpulse import StatusReader

    with pytest.raises(error, match="limit"):
        await StatusReader(nowhere).running_ids(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(error, match="max_entries"):
        StatusReader(nowhere, max_entries=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("last", ["bogus", "1-2-3", "", "-1-0"])
async def test_both_readers_refuse_a_bad_resume_id_before_any_redis_call(
    nowhere: aioredis.Redis, last: str
) -> None:
    import redis

    from jobpulse import StatusReader
    from jobpulse.sync import StatusReader as SyncStatusReader

    with pytest.raises(ValueError, match="last_event_id"):
        StatusReader(nowhere).watch("job", last_event_id=last)
    sync_client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    with pytest.raises(ValueError, match="last_event_id"):
        SyncStatusReader(sync_client).watch("job", last_event_id=last)


@pytest.mark.parametrize(("timeout", "error"), [(-1, ValueError), (math.inf, ValueError)])
async def test_both_readers_refuse_a_bad_wait_timeout_before_any_redis_call(
    nowhere: aioredis.Redis, timeout: float, error: type[Exception]
) -> None:
    import redis

    from jobpulse import StatusReader
    from jobpulse.sync import StatusReader as SyncStatusReader

    with pytest.raises(error, match="timeout"):
        await StatusReader(nowhere).wait("job", timeout=timeout)
    sync_client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    with pytest.raises(error, match="timeout"):
        SyncStatusReader(sync_client).wait("job", timeout=timeout)
