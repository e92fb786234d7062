"""cli/layout and the pure formatting of cli/render: rows fit the terminal's width, the id is cut
last and in its middle, and a STALE or ended job shows no ETA, rate or standstill."""

from __future__ import annotations

import itertools
from dataclasses import replace

from jobpulse import JobState, JobStatus
from jobpulse.cli.layout import MIN_ID, fit, fit_id
from jobpulse.cli.render import fit_line, jobs_table, live_eta, live_rate, live_still, status_line

SAQ = "saq:job:default:00000000-0000-0000-0000-003f2a9c1e7b"
ORDER = ("job", "bar", "percent", "count", "eta", "still", "state")
OPTIONAL = ("percent", "bar", "eta", "still", "count")
CELLS = {"percent": 4, "count": 13, "eta": 9, "still": 11, "state": 7}


def layout(width: int, job: str = SAQ, **cells: int) -> tuple[tuple[str, ...], dict[str, int]]:
    got = fit(
        width, {**CELLS, **cells, "job": len(job)}, order=ORDER, required=("state",),
        optional=OPTIONAL, flexible={"bar": (10, 30)},
    )  # fmt: skip
    return got.columns, dict(got.widths)


def test_the_id_stays_whole_and_the_least_useful_columns_go_first() -> None:
    columns, widths = layout(80)
    # 52 + state 8 + percent 5 + bar 11 = 76: eta (10) no longer fits beside the whole id
    assert columns == ("job", "bar", "percent", "state")
    assert widths["job"] == len(SAQ)
    assert widths["bar"] == 10 + 4  # the spare cells go to the bar
    columns, widths = layout(200)
    assert columns == ORDER
    assert widths["bar"] == 30


def test_a_short_id_leaves_room_for_every_column_at_80() -> None:
    columns, _ = layout(80, job="tty-80")
    assert columns == ORDER


def test_the_id_is_cut_only_when_the_required_columns_leave_no_room() -> None:
    columns, widths = layout(40)
    assert columns == ("job", "state")
    assert widths["job"] == 40 - 8


def test_rows_never_exceed_the_width() -> None:
    for width, job_len, count in itertools.product(range(MIN_ID + 8, 220), (3, 52, 120), (1, 13)):
        columns, widths = layout(width, job="x" * job_len, count=count)
        assert sum(widths[c] for c in columns) + len(columns) - 1 <= width, (width, job_len)


def test_empty_columns_take_no_room() -> None:
    columns, _ = layout(200, eta=0, still=0)
    assert "eta" not in columns
    assert "still" not in columns


def test_fit_id_keeps_the_head_and_more_of_the_tail() -> None:
    assert fit_id(SAQ, 100) == SAQ
    cut = fit_id(SAQ, 24)
    assert len(cut) == 24
    assert cut == SAQ[:7] + "…" + SAQ[-16:]


def statuses() -> list[JobStatus]:
    running = JobStatus(
        job_id=SAQ, state=JobState.RUNNING, done=4, total=10, percent=40.0, rate=2.5, eta=2.4,
        heartbeat_age=0.2, progress_age=95.0, stage="load", worker="h:1",
    )  # fmt: skip
    return [
        running,
        replace(running, job_id="dead-1", state=JobState.STALE),
        replace(running, job_id="lost-1", state=JobState.LOST),
    ]


def test_only_a_running_job_shows_eta_rate_and_standstill() -> None:
    running, stale, lost = statuses()
    assert (live_eta(running), live_rate(running), live_still(running)) == (
        "2.4s", "2.5/s", "1m35s",
    )  # fmt: skip
    for st in (stale, lost):
        assert (live_eta(st), live_rate(st), live_still(st)) == ("", "", "")
        assert "eta -" in status_line(st)
        assert "rate -" in status_line(st)
        assert "still" not in status_line(st)
    assert "still 1m35s" in status_line(running)


def test_the_ls_table_fits_the_terminal_and_keeps_every_column_in_a_pipe() -> None:
    wide = jobs_table(statuses()).splitlines()
    assert wide[0].split() == ["JOB", "STATE", "STAGE", "PROGRESS", "RATE", "ETA", "STILL",
                               "BEAT", "RSS", "CPU", "WORKER"]  # fmt: skip
    assert any(len(line) > 80 for line in wide)
    narrow = jobs_table(statuses(), width=80).splitlines()
    assert all(len(line) <= 80 for line in narrow), narrow
    assert narrow[0].split()[:4] == ["JOB", "STATE", "PROGRESS", "STILL"]
    assert narrow[1].startswith(SAQ + "  RUNNING")


def test_fit_line_drops_trailing_parts() -> None:
    running = statuses()[0]
    line = fit_line(status_line(running), 80)
    assert len(line) <= 80
    assert line.startswith(f"{SAQ}  RUNNING")
