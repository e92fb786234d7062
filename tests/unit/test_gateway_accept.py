"""``accepted()`` and ``status_path()``: the 202 and its Location (pure, no Redis)."""

from __future__ import annotations

import orjson
import pytest
from starlette.requests import Request

from jobpulse import InvalidJobId
from jobpulse.http import accepted
from jobpulse.http.accept import status_path


def request(root_path: str = "") -> Request:
    return Request({"type": "http", "method": "POST", "path": "/reports", "root_path": root_path,
                    "headers": [], "query_string": b""})  # fmt: skip


def test_accepted_is_a_202_naming_the_status_and_events_urls() -> None:
    r = accepted(request(), "report-1", mount="/jobpulse")
    assert r.status_code == 202
    assert r.headers["location"] == "/jobpulse/jobs/report-1"
    assert r.headers["retry-after"] == "1"
    assert r.headers["cache-control"] == "no-store"
    assert orjson.loads(r.body) == {
        "job_id": "report-1",
        "status": "/jobpulse/jobs/report-1",
        "events": "/jobpulse/jobs/report-1/events",
    }


@pytest.mark.parametrize(
    ("root", "mount", "job", "path"),
    [
        ("", "", "a", "/jobs/a"),
        ("/api", "/jobpulse", "a", "/api/jobpulse/jobs/a"),
        ("/api/", "/jobpulse/", "a", "/api/jobpulse/jobs/a"),
        ("", "/jp", "etl/2024:x", "/jp/jobs/etl%2F2024:x"),
        ("", "/jp", "x/events", "/jp/jobs/x%2Fevents"),
    ],
)
def test_status_path_honours_root_path_mount_and_encodes_the_id(
    root: str, mount: str, job: str, path: str
) -> None:
    assert status_path(request(root), job, mount=mount) == path


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidJobId):
        accepted(request(), "has space")
    with pytest.raises(ValueError, match="mount"):
        accepted(request(), "a", mount="jobpulse")
