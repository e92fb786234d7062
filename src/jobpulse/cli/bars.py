"""The rich progress bars of ``watch`` and ``demo`` (imported only when rich draws on a terminal).

Every column reads the task's latest :class:`~jobpulse.JobStatus` (``task.fields["st"]``), so
what is drawn is exactly what a reader saw in Redis — rich's own speed estimate is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.progress_bar import ProgressBar
from rich.text import Text

from .render import STATE_STYLES, fmt_beat, fmt_bytes, fmt_count, fmt_percent, fmt_rate, fmt_seconds

__all__ = ["make_progress"]

_BAD = frozenset({"STALE", "FAILED", "LOST"})


class _Field(ProgressColumn):
    """A text column computed from the task's JobStatus."""

    def __init__(self, text: Callable[[Any], str], style: str | Callable[[Any], str] = "") -> None:
        super().__init__()
        self._text = text
        self._style = style

    def render(self, task: Task) -> Text:
        st = task.fields.get("st")
        if st is None:
            return Text("")
        style = self._style(st) if callable(self._style) else self._style
        return Text(self._text(st), style=style)


class _Bar(ProgressColumn):
    """The bar: cyan while running, green when completed, red when STALE, FAILED or LOST."""

    def __init__(self, width: int = 30) -> None:
        super().__init__()
        self._width = width

    def render(self, task: Task) -> ProgressBar:
        st = task.fields.get("st")
        state = st.state.name if st is not None else "RUNNING"
        colour = "red" if state in _BAD else "yellow" if state == "CANCELLED" else "cyan"
        return ProgressBar(
            total=task.total,
            completed=task.completed,
            width=self._width,
            pulse=task.total is None and state == "RUNNING",
            complete_style=colour,
            finished_style="red" if state in _BAD else "green",
        )


def _stale(st: Any) -> bool:
    return bool(st.state.name == "STALE")


def _state_text(st: Any) -> str:
    if st.state.name == "STALE":
        return f"STALE (no heartbeat for {fmt_seconds(st.heartbeat_age)})"
    return str(st.state.name)


def make_progress(console: Console) -> Progress:
    """The Progress with jobpulse's columns, drawing on ``console``."""
    return Progress(
        _Field(lambda st: st.job_id, "bold"),
        _Bar(),
        _Field(fmt_percent, "bold"),
        _Field(fmt_count),
        _Field(lambda st: fmt_rate(st.rate), "green"),
        _Field(lambda st: f"eta {fmt_seconds(st.eta)}", "cyan"),
        _Field(lambda st: st.stage or "-", "magenta"),
        _Field(lambda st: f"rss {fmt_bytes(st.rss_bytes)}"),
        _Field(lambda st: f"cpu {fmt_seconds(st.cpu_seconds)}"),
        _Field(lambda st: f"♥ {fmt_beat(st)}", lambda st: "bold red" if _stale(st) else "red"),
        _Field(_state_text, lambda st: STATE_STYLES.get(st.state.name, "")),
        console=console,
        auto_refresh=True,
        refresh_per_second=8,
        redirect_stdout=False,
        redirect_stderr=False,
    )
