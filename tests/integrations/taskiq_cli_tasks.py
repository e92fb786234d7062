"""Tasks of the test taskiq app defined in a module of their own, which the taskiq CLI imports
after the broker's module (``taskiq worker tests.integrations.taskiq_cli_app:broker
tests.integrations.taskiq_cli_tasks``): registered after ``instrument()``, before startup."""

from __future__ import annotations

import jobpulse
from tests.integrations.taskiq_cli_app import broker


@broker.task(task_name="late_probe")
def late_probe() -> str:
    """What ``jobpulse.current()`` is inside a task registered after ``instrument()``."""
    hb = jobpulse.current()
    return "none" if hb is None else hb.kind
