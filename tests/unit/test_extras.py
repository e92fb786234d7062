"""The queue extras admit only what the suite runs: the installed (tested) version of each queue
satisfies its extra, and the arq extra leaves out arq 0.26+, which caps redis-py below 6 (pip
resolved ``.[arq]`` to arq 0.28 and redis-py 5.3.1, a combination nothing tests)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement

from tests.support import ROOT

EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def requirement(extra: str, name: str) -> Requirement:
    (found,) = (r for r in map(Requirement, EXTRAS[extra]) if r.name == name)
    return found


def test_each_queue_extra_admits_the_tested_version() -> None:
    for extra, dist in [
        ("arq", "arq"), ("saq", "saq"), ("taskiq", "taskiq"), ("taskiq", "taskiq-redis"),
        ("celery", "celery"), ("rq", "rq"), ("dramatiq", "dramatiq"),
    ]:  # fmt: skip
        assert requirement(extra, dist).specifier.contains(version(dist)), (extra, dist)


def test_the_arq_extra_leaves_out_the_arq_that_downgrades_redis_py() -> None:
    arq = requirement("arq", "arq").specifier
    assert not arq.contains("0.26.0")
    assert not arq.contains("0.28.0")
    assert int(version("redis").split(".")[0]) >= 6  # the suite runs arq beside redis-py 6+
