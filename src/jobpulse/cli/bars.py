"""The rich progress bars of ``watch`` and ``demo`` (imported only when rich draws on a terminal).

Every column reads the task's latest :class:`~jobpulse.JobStatus` (``task.fields["st"]``), so
what is drawn is exactly what a reader saw in Redis — rich's own speed estimate is not used.
Each frame is laid out for the console's width by :func:`~jobpulse.cli.layout.fit`: one line
per job, never wrapped; the least useful columns go first, the job id last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.progress import Progress, Task
from rich.progress_bar import ProgressBar
from rich.table import Column, Table
from rich.text import Text

from .layout import fit, fit_id
from .render import (
    STATE_STYLES,
    fmt_beat,
    fmt_bytes,
    fmt_count,
    fmt_percent,
    fmt_seconds,
    live_eta,
    live_rate,
    live_still,
)

__all__ = ["make_progress"]

_BAD = frozenset({"STALE", "FAILED", "LOST"})

ORDER = ("job", "bar", "percent", "count", "rate", "eta", "stage", "rss", "cpu", "still", "beat",
         "state")  # fmt: skip
"""The columns, in display order."""
OPTIONAL = ("percent", "bar", "eta", "still", "count", "beat", "rate", "stage", "rss", "cpu")
"""The columns beside the id and the state, most useful first (dropped from the end)."""
BAR = (10, 30)
"""The bar's least and most length."""
STAGE_MOST = 20
"""The longest stage name drawn (longer ones are cut with an ellipsis)."""


def _state_text(st: Any) -> str:
    if st.state.name == "STALE":
        return f"STALE (no heartbeat for {fmt_seconds(st.heartbeat_age)})"
    return str(st.state.name)


def _stage(st: Any) -> str:
    stage = st.stage or "-"
    return stage if len(stage) <= STAGE_MOST else stage[: STAGE_MOST - 1] + "…"


def _prefixed(prefix: str, text: str) -> str:
    return f"{prefix} {text}" if text else ""


_TEXT: dict[str, tuple[Callable[[Any], str], Callable[[Any], str]]] = {
    "percent": (fmt_percent, lambda st: "bold"),
    "count": (fmt_count, lambda st: ""),
    "rate": (live_rate, lambda st: "green"),
    "eta": (lambda st: _prefixed("eta", live_eta(st)), lambda st: "cyan"),
    "stage": (_stage, lambda st: "magenta"),
    "rss": (lambda st: f"rss {fmt_bytes(st.rss_bytes)}", lambda st: ""),
    "cpu": (lambda st: f"cpu {fmt_seconds(st.cpu_seconds)}", lambda st: ""),
    "still": (lambda st: _prefixed("still", live_still(st)), lambda st: "yellow"),
    "beat": (
        lambda st: f"♥ {fmt_beat(st)}",
        lambda st: "bold red" if st.state.name == "STALE" else "red",
    ),
    "state": (_state_text, lambda st: STATE_STYLES.get(st.state.name, "")),
}
"""Each text column: its text and its style, from the JobStatus."""


def _bar(task: Task, st: Any, width: int) -> ProgressBar:
    """The bar: cyan while running, green when completed, red when STALE, FAILED or LOST."""
    state = st.state.name
    colour = "red" if state in _BAD else "yellow" if state == "CANCELLED" else "cyan"
    return ProgressBar(
        total=task.total,
        completed=task.completed,
        width=width,
        pulse=task.total is None and state == "RUNNING",
        complete_style=colour,
        finished_style="red" if state in _BAD else "green",
    )


class _Bars(Progress):
    """A Progress whose rows are laid out for the console's width at every refresh."""

    def __init__(self, console: Console) -> None:
        self._screen = console  # Progress.console reads self.live, which rich sets up last
        super().__init__(
            console=console,
            auto_refresh=True,
            refresh_per_second=8,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def make_tasks_table(self, tasks: Iterable[Task]) -> Table:
        rows = [(t, t.fields["st"]) for t in tasks if t.visible and t.fields.get("st")]
        texts = [{name: text(st) for name, (text, _) in _TEXT.items()} for _, st in rows]
        cells = {name: max((cell_len(row[name]) for row in texts), default=0) for name in _TEXT}
        cells["job"] = max((cell_len(st.job_id) for _, st in rows), default=1)
        layout = fit(
            self._screen.width, cells, order=ORDER, required=("state",), optional=OPTIONAL,
            flexible={"bar": BAR},
        )  # fmt: skip
        table = Table.grid(
            *(Column(no_wrap=True, width=layout.widths[n]) for n in layout.columns),
            padding=(0, 1),
        )
        for (task, st), text in zip(rows, texts, strict=True):
            row: list[RenderableType] = []
            for name in layout.columns:
                width = layout.widths[name]
                if name == "job":
                    row.append(Text(fit_id(st.job_id, width), style="bold"))
                elif name == "bar":
                    row.append(_bar(task, st, width))
                else:
                    row.append(Text(text[name], style=_TEXT[name][1](st)))
            table.add_row(*row)
        return table


def make_progress(console: Console) -> Progress:
    """The Progress with jobpulse's columns, drawing on ``console``."""
    return _Bars(console)
