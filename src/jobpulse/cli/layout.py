"""Which columns fit the terminal: the pure layout of the live bars and of the ``ls`` table.

A row never wraps: columns are dropped, least useful first, until the row fits the width, and
the job id is the last thing cut (in its middle, so a queue's prefix and a UUID's distinguishing
tail both stay). Everything here is a function of cell widths (no rich, no terminal), so it is
tested without one.

Invariant: ``sum(widths) + (columns - 1) <= width`` (one cell between two columns) whenever
the id cut to :data:`MIN_ID` and the required columns fit in ``width`` at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MIN_ID", "Layout", "fit", "fit_id"]

MIN_ID = 12
"""The narrowest a job id is cut to (an ellipsis and its head and tail)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What one frame draws.

    Attributes:
        columns: the names shown, in display order (the id first).
        widths: each shown column's width in cells (the bar's is its length).
    """

    columns: tuple[str, ...]
    widths: Mapping[str, int]


def fit(
    width: int,
    cells: Mapping[str, int],
    *,
    order: Sequence[str],
    required: Sequence[str] = (),
    optional: Sequence[str] = (),
    flexible: Mapping[str, tuple[int, int]] | None = None,
) -> Layout:
    """Choose the columns of a row ``width`` cells wide.

    The id and ``required`` are always shown. Each of ``optional``, most useful first, is added
    while the id still fits whole beside it; a column whose cells are all empty takes no room.
    The id is then cut to what is left (not under :data:`MIN_ID`), and a flexible column (the
    bar) is given what remains, up to its most.

    Args:
        width: the terminal's width.
        cells: the widest cell of each column over the rows (``order``'s names, id included).
        order: the display order; its first name is the id.
        required: columns always shown (the state).
        optional: the other columns, most useful first; those absent are never shown.
        flexible: ``name -> (least, most)`` for columns that stretch: they need ``least``.

    Returns:
        The :class:`Layout`.
    """
    flexible = flexible or {}
    ident = order[0]
    id_width = max(cells.get(ident, 0), 1)

    def need(name: str) -> int:
        return flexible[name][0] if name in flexible else cells.get(name, 0)

    chosen = [name for name in required if need(name) > 0]
    used = sum(1 + need(name) for name in chosen)
    for name in optional:
        if need(name) > 0 and id_width + used + 1 + need(name) <= width:
            chosen.append(name)
            used += 1 + need(name)
    widths = {ident: max(min(id_width, width - used), min(id_width, MIN_ID))}
    spare = max(width - used - widths[ident], 0)
    for name in chosen:
        if name in flexible:
            least, most = flexible[name]
            widths[name] = least + min(spare, most - least)
            spare -= widths[name] - least
        else:
            widths[name] = need(name)
    return Layout(columns=tuple(n for n in order if n == ident or n in chosen), widths=widths)


def fit_id(job_id: str, width: int) -> str:
    """``job_id`` in at most ``width`` cells: cut in the middle with ``…``, keeping more of the
    tail (a UUID's end tells jobs apart; a queue prefix is shared)."""
    if len(job_id) <= width:
        return job_id
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 3
    tail = width - 1 - head
    return f"{job_id[:head]}…{job_id[-tail:]}"
