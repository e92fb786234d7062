"""Property tests: any input gives a clear error or a documented normalisation, garbage is never
written to Redis, and the heartbeat never dies."""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobpulse import InvalidJobId, JobState, ProgressCell, ProtocolError, StatusReader, heartbeat
from jobpulse._protocol.codec import dump_json
from jobpulse._protocol.keys import KeySchema, check_job_id
from jobpulse._worker.config import check_stage

JOB_ID = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)


@given(st.one_of(st.text(max_size=250), st.binary(max_size=10), st.integers(), st.none()))
def test_any_job_id_is_accepted_exactly_when_it_follows_the_grammar(job_id: object) -> None:
    valid = isinstance(job_id, str) and JOB_ID.fullmatch(job_id) is not None
    try:
        check_job_id(job_id)
    except InvalidJobId:
        assert not valid
        return
    assert valid
    assert isinstance(job_id, str)
    for key in KeySchema("ns").job(job_id).all():
        # no input can address a key outside the namespace or outside its own hash tag
        assert key.startswith(f"ns:{{{job_id}}}:")
        assert key.count("{") == 1
        assert key.count("}") == 1


@given(st.text(max_size=250))
def test_any_stage_name_is_accepted_or_refused_with_a_value_error(stage: str) -> None:
    try:
        assert check_stage(stage) == stage
    except ValueError as exc:
        assert "stage" in str(exc)
        assert not (1 <= len(stage) <= 200 and stage.isprintable())


@given(json_values, st.integers(min_value=1, max_value=4096))
def test_meta_and_details_are_json_or_refused_never_truncated(value: Any, limit: int) -> None:
    try:
        text = dump_json(value, limit=limit, name="meta")
    except TypeError as exc:  # integers beyond 64 bits
        assert "meta" in str(exc)
        return
    except ValueError as exc:
        assert "meta" in str(exc)
        assert len(orjson.dumps(value)) > limit
        return
    assert len(text.encode()) <= limit
    # documented normalisation: NaN and infinities become null (JSON has no such numbers)
    assert orjson.loads(text) == _nan_to_none(value)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    return value


progress_values = st.one_of(
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none()
)
ops = st.lists(
    st.tuples(
        st.sampled_from(["advance", "set", "set_total", "stage", "checkpoint"]),
        progress_values | json_values,
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops)
def test_any_progress_sequence_writes_only_well_formed_snapshots(
    redis_url: str, steps: list[tuple[str, Any]]
) -> None:
    asyncio.run(_run_steps(redis_url, steps))


async def _run_steps(url: str, steps: list[tuple[str, Any]]) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    ns = "prop"
    keys = KeySchema(ns).job("p")
    await client.delete(*keys.all())
    try:
        async with heartbeat(client, "p", namespace=ns, interval=0.01, ttl=1.0) as hb:
            cell: ProgressCell = hb.progress
            for op, value in steps:
                try:
                    if op == "advance":
                        cell.advance(value)
                    elif op == "set":
                        cell.set(value)
                    elif op == "set_total":
                        cell.set_total(value)
                    elif op == "stage":
                        hb.set_stage(value)
                    else:
                        await hb.checkpoint(v=value)
                except (TypeError, ValueError, OverflowError):
                    pass  # a clear error for a bad value, raised where the value was given
                before = hb.statistics().beats_written
                async with asyncio.timeout(5):
                    while hb.statistics().beats_written <= before:  # the heartbeat lives on
                        await asyncio.sleep(0.005)
                state = await client.hgetall(keys.state)
                assert state["status"] == "RUNNING"
                assert state["done"].isdigit()  # documented: a negative sum is written as 0
                assert state["total"] == "" or state["total"].isdigit()
                assert state["stage"] == "" or (
                    len(state["stage"]) <= 200 and state["stage"].isprintable()
                )
                for field in ("rate", "eta_s", "cpu_s", "loop_lag_ms"):
                    if state[field]:
                        assert math.isfinite(float(state[field]))
        assert await client.hget(keys.state, "status") == "COMPLETED"
    finally:
        await client.delete(*keys.all())
        await client.aclose()


@pytest.mark.parametrize("value", [-5, 2**63, 2**64, 1.5, math.nan, "3"])
def test_bad_progress_values_raise_where_they_are_given(value: Any) -> None:
    cell = ProgressCell()
    try:
        if isinstance(value, int) and -(2**63) <= value < 2**63:
            cell.set(value)  # a negative lane is allowed; the snapshot clamps the sum at 0
            assert cell.done == value
        else:
            with pytest.raises((TypeError, ValueError, OverflowError)):
                cell.set(value)
    finally:
        cell._unlink()


corrupt_fields = st.dictionaries(
    st.sampled_from(
        [
            "status",
            "done",
            "total",
            "seq",
            "fence",
            "attempt",
            "rate",
            "eta_s",
            "meta",
            "heartbeat_ms",
            "progress_ms",
            "started_ms",
            "stage",
            "error",
            "cpu_s",
            "rss_bytes",
        ]
    ),
    st.one_of(st.binary(max_size=12), st.sampled_from([b"RUNNING", b"COMPLETED", b"-1", b"nan"])),
    max_size=10,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(corrupt_fields)
def test_any_corrupt_hash_gives_a_status_or_a_protocol_error(
    redis_url: str, fields: dict[str, bytes]
) -> None:
    asyncio.run(_read_corrupt(redis_url, fields))


async def _read_corrupt(url: str, fields: dict[str, bytes]) -> None:
    client = aioredis.Redis.from_url(url)
    keys = KeySchema("propcorrupt").job("c")
    await client.delete(*keys.all())
    if fields:
        await client.hset(keys.state, mapping=fields)  # type: ignore[arg-type]
    try:
        async with StatusReader(client, namespace="propcorrupt", cache_ttl=0) as reader:
            try:
                status = await reader.get("c")
            except ProtocolError:
                return  # documented: a foreign or corrupt snapshot
            assert isinstance(status.state, JobState)
            if "status" not in fields:
                assert status.state is JobState.UNKNOWN
    finally:
        await client.delete(*keys.all())
        await client.aclose()
