"""The pure parts shared by the queue integrations (no Redis)."""

from __future__ import annotations

import itertools
import re

import pytest

from jobpulse.integrations import PulseOptions, job_id_for, kind_for
from jobpulse.integrations._common import refresh_delays

VALID = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")


@pytest.mark.parametrize("queue_id", ["0f8e9a", "arq:cron:x:1", "saq:job:default:ab-1", "a" * 200])
def test_valid_ids_are_used_as_they_are(queue_id: str) -> None:
    assert job_id_for(queue_id) == queue_id
    assert job_id_for(queue_id.encode()) == queue_id


@pytest.mark.parametrize("queue_id", ["report 7", "", "a{b}", "é" * 300, "x" * 201, "tab\there"])
def test_other_ids_map_to_a_valid_deterministic_id(queue_id: str) -> None:
    mapped = job_id_for(queue_id)
    assert VALID.fullmatch(mapped)
    assert mapped == job_id_for(queue_id)
    assert re.fullmatch(r".*\.h[0-9a-f]{16}", mapped)


def test_mapping_keeps_a_readable_prefix_and_tells_ids_apart() -> None:
    assert job_id_for("report 7").startswith("report_7.h")
    assert job_id_for("report 7") != job_id_for("report_7") == "report_7"
    assert job_id_for("report 7") != job_id_for("report?7")


def test_kind_is_the_task_name_or_its_sanitised_form() -> None:
    assert kind_for("reports.build") == "reports.build"
    assert kind_for("Class.<locals>.task") == "Class._locals_.task"
    assert len(kind_for("k" * 300)) == 100


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ValueError, match="ttl"):
        PulseOptions(interval=1.0, ttl=1.5)
    with pytest.raises(ValueError, match="interval"):
        PulseOptions(interval=0)
    with pytest.raises(ValueError, match="namespace"):
        PulseOptions(namespace="a b")
    assert PulseOptions(interval=0.5, ttl=2.0).claim_ttl == 2.5


def test_the_claim_is_refreshed_at_once_then_every_period() -> None:
    assert list(itertools.islice(refresh_delays(0.5), 4)) == [0.0, 0.5, 0.5, 0.5]
