"""The heartbeat's options are declared once: the ``TypedDict`` both factories accept, the spec
that holds their defaults, and the checked configuration built from it agree."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
import redis
import redis.asyncio as aioredis

import jobpulse
import jobpulse.sync
from jobpulse._worker.config import HeartbeatConfig
from jobpulse._worker.options import HeartbeatOptions, HeartbeatSpec


def test_the_options_and_the_spec_declare_the_same_names_and_types() -> None:
    declared = typing.get_type_hints(HeartbeatOptions)
    spec = typing.get_type_hints(HeartbeatSpec)
    assert declared == spec
    assert [f.name for f in dataclasses.fields(HeartbeatSpec)] == list(declared)
    assert not HeartbeatOptions.__required_keys__  # every option has its default in the spec


def test_the_checked_config_takes_its_fields_from_the_spec_with_the_same_defaults() -> None:
    spec = HeartbeatSpec()
    for field in dataclasses.fields(HeartbeatConfig):
        assert field.default == getattr(spec, field.name), field.name


@pytest.mark.parametrize("factory", [jobpulse.heartbeat, jobpulse.sync.heartbeat])
def test_both_factories_take_the_declared_options(factory: typing.Any) -> None:
    parameters = inspect.signature(factory).parameters
    # sidecar= and client_factory= choose the driver (their defaults differ by face), the rest
    # are the declared options
    assert list(parameters) == ["redis", "job_id", "sidecar", "client_factory", "options"]
    assert parameters["sidecar"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    assert parameters["options"].annotation == "Unpack[HeartbeatOptions]"


def test_an_unknown_option_is_refused_before_any_redis_command() -> None:
    client = aioredis.Redis(port=1)  # never connected
    with pytest.raises(TypeError, match="totl"):
        jobpulse.heartbeat(client, "x", totl=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="totl"):
        jobpulse.sync.heartbeat(redis.Redis(port=1), "x", totl=1)  # type: ignore[call-arg]
