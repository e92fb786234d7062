"""What the one-call installs do to the queues' settings (no Redis, no worker)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import redis as redis_sync
from arq.worker import func
from taskiq_redis import RedisStreamBroker

from jobpulse.integrations import arq as jp_arq
from jobpulse.integrations import saq as jp_saq
from jobpulse.integrations import taskiq as jp_taskiq


async def report(ctx: dict[str, Any], rows: int) -> int:
    return rows


def test_arq_keeps_names_and_settings_sets_abort_and_wraps_once() -> None:
    class WorkerSettings:
        functions: ClassVar[list[Any]] = [
            report,
            func(report, name="other", timeout=5, max_tries=2),
        ]

    jp_arq.instrument(WorkerSettings, ttl=3.0)
    first = list(WorkerSettings.functions)
    assert [(f.name, f.timeout_s, f.max_tries) for f in first] == [
        ("report", None, None),
        ("other", 5, 2),
    ]
    assert WorkerSettings.allow_abort_jobs is True  # type: ignore[attr-defined]
    jp_arq.instrument(WorkerSettings)
    assert [f.coroutine for f in WorkerSettings.functions] == [f.coroutine for f in first]


def test_arq_respects_an_explicit_allow_abort_jobs_and_returns_a_new_dict() -> None:
    settings = {"functions": [report], "allow_abort_jobs": False}
    out = jp_arq.instrument(settings)
    assert out["allow_abort_jobs"] is False
    assert settings["functions"] == [report]  # the given dict is left alone


def test_saq_keeps_names_and_wraps_once() -> None:
    settings = {"queue": None, "functions": [report, ("custom", report)]}
    once = jp_saq.instrument(settings)
    twice = jp_saq.instrument(once)
    assert [name for name, _ in once["functions"]] == ["report", "custom"]
    assert twice["functions"] == once["functions"]


def test_bad_options_fail_at_install_before_any_redis_command() -> None:
    with pytest.raises(ValueError, match="ttl"):
        jp_arq.instrument({"functions": [report]}, interval=2.0, ttl=3.0)
    with pytest.raises(ValueError, match="interval"):
        jp_saq.instrument({"functions": [report]}, interval=-1)
    broker = RedisStreamBroker("redis://127.0.0.1:1/0")  # never connected
    with pytest.raises(ValueError, match="namespace"):
        jp_taskiq.instrument(broker, namespace="a b")


def test_celery_checks_options_at_install_and_connects_once() -> None:
    from celery import Celery, signals

    from jobpulse.integrations import celery as jp_celery

    app = Celery("install_test", broker="redis://127.0.0.1:1/0")  # never connected
    with pytest.raises(ValueError, match="ttl"):
        jp_celery.instrument(app, interval=2.0, ttl=3.0)
    before = len(signals.task_prerun.receivers)
    assert jp_celery.instrument(app, ttl=3.0) is app
    assert jp_celery.instrument(app) is app
    assert len(signals.task_prerun.receivers) == before + 1


@pytest.mark.parametrize(
    "broker", ["amqp://guest@127.0.0.1:1//", "sentinel://127.0.0.1:1", "memory://", None]
)
def test_celery_refuses_a_broker_it_cannot_write_to_at_install(broker: str | None) -> None:
    # a first version installed, then every task logged "pass redis=" and ran without jobpulse
    from celery import Celery

    from jobpulse.integrations import celery as jp_celery

    app = Celery("install_test", broker=broker)  # None: Celery's default, amqp
    with pytest.raises(ValueError, match=r"broker URL is not redis://.*pass redis="):
        jp_celery.instrument(app)
    assert getattr(app, "_jobpulse", None) is None
    # a plain client (never connected): the sidecar, the default, rebuilds it in its helper
    assert jp_celery.instrument(app, redis=redis_sync.Redis(port=1)) is app


def test_rq_worker_class_checks_options_and_subclasses_the_base() -> None:
    from rq.worker import SimpleWorker, Worker

    from jobpulse.integrations import rq as jp_rq

    with pytest.raises(ValueError, match="ttl"):
        jp_rq.worker_class(interval=2.0, ttl=3.0)
    assert issubclass(jp_rq.worker_class(), Worker)
    assert issubclass(jp_rq.worker_class(SimpleWorker, ttl=3.0), SimpleWorker)


def test_dramatiq_checks_options_and_adds_one_middleware() -> None:
    from dramatiq.brokers.stub import StubBroker

    from jobpulse.integrations import dramatiq as jp_dramatiq

    broker = StubBroker()
    with pytest.raises(ValueError, match="ttl"):
        jp_dramatiq.instrument(broker, interval=2.0, ttl=3.0)
    with pytest.raises(ValueError, match="redis="):
        jp_dramatiq.instrument(broker)  # a stub broker has no Redis client
    # plain clients (never connected): the sidecar, the default, rebuilds them in its helper
    first = jp_dramatiq.instrument(broker, redis=redis_sync.Redis(port=1))
    assert jp_dramatiq.instrument(broker, redis=redis_sync.Redis(port=1)) is first
    assert [m for m in broker.middleware if isinstance(m, jp_dramatiq.JobpulseMiddleware)] == [
        first
    ]
    # the heartbeat is entered last of the before hooks, and left last of the after hooks
    assert broker.middleware[-1] is first
    finals = [m for m in broker.middleware if isinstance(m, jp_dramatiq._FinalWrite)]
    assert finals == [broker.middleware[0]]
    assert finals[0].pulse is first
