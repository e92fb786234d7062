"""How the CLI shows a job: plain lines and tables (always), live rich bars (on a terminal).

``rich`` is imported only here and only when a live display is drawn on a terminal, so every
command also works without the ``cli`` extra (``pip install jobpulse``): ``status``, ``ls`` and
``--json`` print plain text, and ``watch`` / ``demo`` fall back to one line per change.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from .._reader.status import JobStatus

__all__ = [
    "Board",
    "fmt_bytes",
    "fmt_seconds",
    "jobs_table",
    "live_summary",
    "status_block",
    "status_line",
    "to_json",
]

STATE_STYLES = {
    "RUNNING": "cyan",
    "STALE": "bold red",
    "COMPLETED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "yellow",
    "LOST": "bold magenta",
    "UNKNOWN": "dim",
}


# -- plain formatting (pure) ---------------------------------------------------------------------


def fmt_bytes(n: int | None) -> str:
    """``48.2 MiB`` (``-`` when unknown)."""
    if n is None:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB"


def fmt_seconds(s: float | None) -> str:
    """``4.2s``, ``3m07s``, ``2h05m`` (``-`` when unknown)."""
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        m, sec = divmod(int(s), 60)
        return f"{m}m{sec:02d}s"
    h, rest = divmod(int(s), 3600)
    return f"{h}h{rest // 60:02d}m"


def fmt_rate(rate: float | None) -> str:
    """``612.4/s`` (``-`` when unknown)."""
    return "-" if rate is None else f"{rate:.1f}/s"


def live_rate(st: JobStatus) -> str:
    """The rate while the job is RUNNING (``""`` otherwise: a STALE or ended job has no rate)."""
    return fmt_rate(st.rate) if st.state.name == "RUNNING" else ""


def live_eta(st: JobStatus) -> str:
    """The ETA while the job is RUNNING (``""`` otherwise: nothing is left to estimate, or the
    worker that estimated it stopped beating)."""
    return fmt_seconds(st.eta) if st.state.name == "RUNNING" else ""


def live_still(st: JobStatus) -> str:
    """How long ``done`` has stood still while the job is RUNNING (``""`` otherwise): a worker
    that beats but does not advance shows a growing value ("alive but not advancing")."""
    if st.state.name != "RUNNING" or st.progress_age is None:
        return ""
    return fmt_seconds(st.progress_age)


def fmt_beat(st: JobStatus) -> str:
    """Seconds since the last heartbeat (``ended`` once the job is terminal: no more beats)."""
    if st.state.is_terminal:
        return "ended"
    return f"{fmt_seconds(st.heartbeat_age)} ago"


def fmt_count(st: JobStatus) -> str:
    """``5120/20000``, or ``5120`` without a total."""
    done = "-" if st.done is None else str(st.done)
    return done if st.total is None else f"{done}/{st.total}"


def fmt_percent(st: JobStatus) -> str:
    """``42%`` (``-`` without a total)."""
    return "-" if st.percent is None else f"{st.percent:.0f}%"


def status_line(st: JobStatus) -> str:
    """One line: what a watcher prints per change when it cannot draw a bar."""
    parts = [st.job_id, st.state.name]
    if st.state.name == "UNKNOWN":
        return " ".join(parts)
    parts += [
        f"stage={st.stage or '-'}",
        f"{fmt_count(st)} ({fmt_percent(st)})",
        f"rate {live_rate(st) or '-'}",
        f"eta {live_eta(st) or '-'}",
        f"rss {fmt_bytes(st.rss_bytes)}",
        f"cpu {fmt_seconds(st.cpu_seconds)}",
        f"beat {fmt_beat(st)}",
    ]
    if live_still(st):
        parts.insert(5, f"still {live_still(st)}")
    if st.error:
        parts.append(f"error: {st.error}")
    return "  ".join(parts)


def fit_line(line: str, width: int) -> str:
    """A :func:`status_line` in ``width`` cells: its trailing parts dropped until it fits (the
    id, state and progress come first); a lone part is cut with ``…``."""
    parts = line.split("  ")
    while len(parts) > 1 and len("  ".join(parts)) > width:
        parts.pop()
    out = "  ".join(parts)
    return out if len(out) <= width else out[: max(width - 1, 0)] + "…"


_BLOCK_ROWS: tuple[tuple[str, Any], ...] = (
    ("state", lambda st: st.state.name),
    ("stage", lambda st: st.stage or "-"),
    ("progress", lambda st: f"{fmt_count(st)} ({fmt_percent(st)})"),
    ("rate", lambda st: live_rate(st) or "-"),
    ("eta", lambda st: live_eta(st) or "-"),
    ("rss", lambda st: fmt_bytes(st.rss_bytes)),
    ("cpu", lambda st: fmt_seconds(st.cpu_seconds)),
    ("loop lag", lambda st: "-" if st.loop_lag is None else f"{st.loop_lag * 1000:.1f} ms"),
    ("heartbeat", fmt_beat),
    ("progress age", lambda st: f"{fmt_seconds(st.progress_age)} ago (done last changed)"),
    ("worker", lambda st: st.worker or "-"),
    ("attempt", lambda st: "-" if st.attempt is None else f"{st.attempt} (fence {st.fence})"),
    ("error", lambda st: st.error or "-"),
)


def status_block(st: JobStatus) -> str:
    """The ``status`` command's human output: one ``name: value`` line per field."""
    if st.state.name == "UNKNOWN":
        return f"{st.job_id}: UNKNOWN (no such job, or it expired)"
    width = max(len(name) for name, _ in _BLOCK_ROWS)
    lines = [st.job_id]
    lines += [f"  {name:<{width}}  {get(st)}" for name, get in _BLOCK_ROWS]
    if st.meta is not None:
        lines.append(f"  {'meta':<{width}}  {to_json(st.meta)}")
    return "\n".join(lines)


_TABLE_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("JOB", lambda st: st.job_id),
    ("STATE", lambda st: st.state.name),
    ("STAGE", lambda st: st.stage or "-"),
    ("PROGRESS", lambda st: f"{fmt_count(st)} {fmt_percent(st)}"),
    ("RATE", lambda st: live_rate(st) or "-"),
    ("ETA", lambda st: live_eta(st) or "-"),
    ("STILL", lambda st: live_still(st) or "-"),
    ("BEAT", fmt_beat),
    ("RSS", lambda st: fmt_bytes(st.rss_bytes)),
    ("CPU", lambda st: fmt_seconds(st.cpu_seconds)),
    ("WORKER", lambda st: st.worker or "-"),
)
_TABLE_OPTIONAL = ("PROGRESS", "STILL", "ETA", "BEAT", "STAGE", "RATE", "WORKER", "RSS", "CPU")
"""The ``ls`` columns beside JOB and STATE, most useful first (dropped from the end)."""


def jobs_table(statuses: Iterable[JobStatus], width: int | None = None) -> str:
    """The ``ls`` command's table, as aligned plain text.

    Args:
        statuses: the rows.
        width: the terminal's width: columns that do not fit are left out, least useful
            first (see :func:`~jobpulse.cli.layout.fit`); None (a pipe) keeps them all.
    """
    from .layout import fit, fit_id

    names = [name for name, _ in _TABLE_COLUMNS]
    rows = [dict(zip(names, names, strict=True))]
    rows += [{name: str(get(st)) for name, get in _TABLE_COLUMNS} for st in statuses]
    cells = {name: max(len(row[name]) for row in rows) for name in names}
    shown: tuple[str, ...] = tuple(names)
    if width is not None:
        # two spaces between columns: fit() counts one, so each cell is given one more
        layout = fit(
            width + 1,
            {name: w + 1 for name, w in cells.items()},
            order=names,
            required=("STATE",),
            optional=_TABLE_OPTIONAL,
        )
        shown = layout.columns
        cells = {name: layout.widths[name] - 1 for name in shown}
    return "\n".join(
        "  ".join(
            (fit_id(row[name], cells[name]) if name == "JOB" else row[name]).ljust(cells[name])
            for name in shown
        ).rstrip()
        for row in rows
    )


def to_json(value: Any) -> str:
    """Compact JSON text (orjson; non-JSON values are shown with ``str``)."""
    return orjson.dumps(value, default=str).decode()


# -- the live display ----------------------------------------------------------------------------


class Board:
    """The live view of one or more jobs, used by ``watch`` and ``demo``.

    On a terminal with ``rich`` installed it draws one progress bar per job (percent, count,
    rate, ETA, stage, RSS, CPU, how long progress stood still, heartbeat age, state), red once a
    job is STALE, one line per job whatever the terminal's width (columns that do not fit are
    left out). Otherwise it
    prints :func:`status_line` when a job's state, stage or count changes (at most every
    ``plain_every`` seconds per job), or one JSON object per change with ``json=True``.

    Args:
        stream: where to draw (default stdout).
        json: print each change as one JSON line instead.
        live: force the rich display on (True) or off (False); None decides by the stream.
        plain_every: the least seconds between two plain lines of one job.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        json: bool = False,
        live: bool | None = None,
        plain_every: float = 1.0,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._json = json
        self._plain_every = plain_every
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._last: dict[str, tuple[Any, ...]] = {}
        self._printed_at: dict[str, float] = {}
        self._hint = False
        if not json and live is not False:
            self._progress = _rich_progress(self._stream, force=live is True)
            self._hint = self._progress is None and _no_rich() and _isatty(self._stream)

    @property
    def live(self) -> bool:
        """True when bars are drawn (rich on a terminal)."""
        return self._progress is not None

    @property
    def width(self) -> int | None:
        """The terminal's width while bars are drawn (None for plain lines and JSON)."""
        return None if self._progress is None else int(self._progress.console.width)

    def __enter__(self) -> Board:
        if self._progress is not None:
            self._progress.start()
        elif self._hint:
            self._hint = False
            print('(for live bars: pip install "jobpulse[cli]")', file=sys.stderr, flush=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()

    def show(self, st: JobStatus) -> None:
        """Show the latest status of ``st.job_id``."""
        if self._progress is not None:
            self._show_live(st)
            return
        key = (st.state, st.stage, st.done, st.total, st.attempt)
        changed = self._last.get(st.job_id) != key
        now = time.monotonic()
        due = now - self._printed_at.get(st.job_id, -1e9) >= self._plain_every
        settled = st.state.is_settled or st.state.name == "UNKNOWN"
        state_changed = self._last.get(st.job_id, (None,))[0] != st.state
        if not changed or not (due or settled or state_changed):
            return
        self._last[st.job_id] = key
        self._printed_at[st.job_id] = now
        self._write(to_json(st.as_dict()) if self._json else status_line(st))

    def say(self, text: str, style: str | None = None) -> None:
        """Print a message line (above the bars when they are drawn; stderr in JSON mode)."""
        if self._progress is not None:
            from rich.text import Text

            # A Text of its own: print(style=...) would also restyle the bars drawn after it.
            self._progress.console.print(Text(text, style=style or ""), highlight=False)
        elif self._json:
            print(text, file=sys.stderr, flush=True)
        else:
            self._write(text)

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

    def _show_live(self, st: JobStatus) -> None:
        total = st.total if st.total else None
        done = st.done or 0
        if st.state.name == "COMPLETED" and total is None:
            total = done or 1  # a job without a total shows a full bar once it completed
        task = self._tasks.get(st.job_id)
        if task is None:
            task = self._progress.add_task(st.job_id, total=total, completed=done, st=st)
            self._tasks[st.job_id] = task
        else:
            self._progress.update(task, total=total, completed=done, st=st)


def _rich_progress(stream: IO[str], *, force: bool) -> Any:
    """A rich ``Progress`` drawing on ``stream`` when it is a terminal (or forced), else None."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console(file=stream, force_terminal=True if force else None)
    if not console.is_terminal:
        return None
    from .bars import make_progress

    return make_progress(console)


def _no_rich() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("rich") is None
    except ValueError:  # sys.modules["rich"] is None: hidden
        return True


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def live_summary(statuses: Sequence[JobStatus]) -> str:
    """One short line per job for the end of a demo."""
    return "\n".join(
        f"  {st.job_id}: {st.state.name} {fmt_count(st)}"
        + (f" ({st.error})" if st.error and st.state.name != "COMPLETED" else "")
        for st in statuses
    )
