"""docs/operations/: the Grafana board and the alert rules parse, and every query names a metric
that the collector really exports (cross-checked against a real scrape)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import redis.asyncio as aioredis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from jobpulse import Sweeper, heartbeat
from jobpulse.metrics.prometheus import scrape

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations"
METRIC = re.compile(r"\bjobpulse_[a-z0-9_]+")


async def exported(redis: aioredis.Redis, ns: str) -> set[str]:
    """Sample names of a real scrape: a job running, a sweep done, worker counters."""
    async with heartbeat(redis, "ops1", namespace=ns, kind="report"):
        await Sweeper(redis, namespace=ns).sweep()
        text = (await scrape(redis, namespace=ns)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def board_queries() -> list[str]:
    board = json.loads((DOCS / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return queries


def alert_queries() -> list[str]:
    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


async def test_every_board_query_names_an_exported_metric(redis: aioredis.Redis, ns: str) -> None:
    names = await exported(redis, ns)
    queries = board_queries()
    assert len(queries) >= 10
    for query in queries:
        used = set(METRIC.findall(query))
        assert used, query
        assert used <= names, (query, used - names)


async def test_every_alert_names_an_exported_metric(redis: aioredis.Redis, ns: str) -> None:
    names = await exported(redis, ns)
    rules = yaml.safe_load((DOCS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"JobpulseStaleJobs", "JobpulseNoSweeper", "JobpulseBeatFailures",
            "JobpulseLoopLag", "JobpulseJobNotAdvancing"} <= alerts  # fmt: skip
    for query in alert_queries():
        used = set(METRIC.findall(query))
        assert used, query
        assert used <= names, (query, used - names)


def test_board_panels_have_unique_ids_and_a_datasource_variable() -> None:
    board = json.loads((DOCS / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "kind"}
