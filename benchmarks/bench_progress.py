"""``ProgressCell.advance()`` overhead on a CPU loop (issue 2, benchmark 1).

A pure-Python kernel calibrated to ~10 µs per item runs with and without one ``cell.advance()``
per item, in interleaved repeats; the slowdown is the median of the paired time ratios. The
per-call cost of ``advance()`` is measured in a tight loop beside the reference points a bare
loop iteration, a ``multiprocessing.RawValue`` store and a ctypes increment over shared memory.
No Redis is involved: the cell is shared memory and an update does no I/O.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from multiprocessing import shared_memory
from typing import Any

from jobpulse import ProgressCell

from .common import median, no_gc

NAME = "progress"
TITLE = "ProgressCell.advance() overhead"
GOAL_SLOWDOWN = 0.01


def kernel(k: int) -> int:
    """A small integer-arithmetic kernel; ``k`` iterations."""
    x = 1
    for _ in range(k):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return x


def calibrate(target_ns: float = 10_000.0) -> int:
    k = 100
    for _ in range(6):
        t0 = time.thread_time_ns()
        for _ in range(2000):
            kernel(k)
        per = (time.thread_time_ns() - t0) / 2000
        k = max(1, round(k * target_ns / per))
    return k


def loop_plain(items: int, k: int) -> None:
    for _ in range(items):
        kernel(k)


def loop_cell(items: int, k: int, cell: ProgressCell) -> None:
    for _ in range(items):
        kernel(k)
        cell.advance()


def _time(fn: Any, *args: Any) -> float:
    """The thread's CPU time of one call, in ns: the time slices other processes take on a
    shared machine are not counted (wall time swung the paired ratios by ±40 % under a load
    average of 6 on 2 cores; CPU time by ±5-10 %)."""
    t0 = time.thread_time_ns()
    fn(*args)
    return float(time.thread_time_ns() - t0)


def micro(n: int, repeats: int) -> dict[str, float]:
    """ns per iteration of a tight loop doing nothing / one update of each kind."""
    cell = ProgressCell()
    raw = multiprocessing.RawValue("q", 0)
    shm = shared_memory.SharedMemory(create=True, size=8)
    holder = [ctypes.c_int64.from_buffer(shm.buf)]  # type: ignore[arg-type]
    r = range(n)

    def bare() -> None:
        for _ in r:
            pass

    def rawvalue() -> None:
        for i in r:
            raw.value = i

    def ctypes_inc() -> None:
        cint = holder[0]
        for _ in r:
            cint.value += 1

    def advance() -> None:
        for _ in r:
            cell.advance()

    kinds = {"bare": bare, "rawvalue": rawvalue, "ctypes": ctypes_inc, "advance": advance}
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        with no_gc():
            for _ in range(repeats):
                for name, fn in kinds.items():
                    samples[name].append(_time(fn) / n)
    finally:
        holder.clear()  # release the export before close()
        shm.close()
        shm.unlink()
        cell._unlink()
    return {k: median(v) for k, v in samples.items()}


def run(quick: bool = False) -> dict[str, Any]:
    items = 3_000 if quick else 20_000
    repeats = 7 if quick else 21
    k = calibrate()
    cell = ProgressCell(total=items * repeats)
    plain: list[float] = []
    with_cell: list[float] = []
    try:
        with no_gc():
            loop_plain(items // 10, k)  # warm up
            loop_cell(items // 10, k, cell)
            for i in range(repeats):
                pair = [(plain, loop_plain, ()), (with_cell, loop_cell, (cell,))]
                if i % 2:
                    pair.reverse()
                for sink, fn, extra in pair:
                    sink.append(_time(fn, items, k, *extra))
    finally:
        cell._unlink()
    ratios = [c / p for c, p in zip(with_cell, plain, strict=True)]
    slowdown = median(ratios) - 1
    spread = sorted(ratios)
    quartiles = (spread[len(spread) // 4] - 1, spread[(3 * len(spread)) // 4] - 1)
    item_ns = median(plain) / items
    m = micro(200_000 if quick else 1_000_000, 5 if quick else 9)
    adv_ns = m["advance"] - m["bare"]
    raw_ns = m["rawvalue"] - m["bare"]
    ct_ns = m["ctypes"] - m["bare"]
    # The call's own cost over the item's: what one advance() adds to each item, measured
    # in a tight loop (resolves a few ns; the paired loops resolve a few % on a loaded machine).
    per_call = adv_ns / item_ns
    ok = per_call < GOAL_SLOWDOWN
    findings = [
        f"`advance()` costs {adv_ns:.0f} ns a call (CPU time, tight loop): "
        f"{per_call * 100:.2f} % of a {item_ns / 1000:.1f} µs item, "
        f"{'under' if ok else 'over'} the 1 % goal. The paired loops "
        f"(with and without one `advance()` per item) gave a median of {slowdown * 100:+.2f} % "
        f"with quartiles {quartiles[0] * 100:+.1f} % / {quartiles[1] * 100:+.1f} %: on this "
        "shared machine they cannot resolve 1 %. The floor is a Python method call "
        "(~30-35 ns on CPython 3.11) plus a store of a Python int into a shared-memory "
        f"`memoryview` (a `RawValue` store alone is {raw_ns:.0f} ns); tried: one attribute "
        "read fewer in `advance()` (~2 ns, kept); a bound `memoryview.__setitem__` and ctypes "
        "are slower than the subscript store."
    ]

    return {
        "name": NAME,
        "title": TITLE,
        "issue": 2,
        "method": (
            f"A pure-Python integer kernel calibrated to ~10 µs per item ({k} iterations, measured "
            f"{item_ns / 1000:.2f} µs) runs {items:,} items per repeat with and without one "
            f"`cell.advance()` per item, {repeats} interleaved repeats (order alternating, "
            "GC off), "
            "and the loop slowdown is the median of the paired time ratios minus one. The cost "
            "per call is a tight loop of each update minus a bare loop iteration, median of "
            "interleaved repeats, beside a `multiprocessing.RawValue` store and a ctypes "
            "increment over shared memory for reference; the goal is judged on that cost over "
            "the item's time (the paired loops are shown beside it with their quartiles). "
            "Every time is the thread's CPU time (`time.thread_time_ns`), not wall time: other "
            "processes on the shared machine do not count."
        ),
        "tables": [
            {
                "title": "Slowdown of a ~10 µs/item CPU loop "
                "(baseline: the same loop without updates)",
                "columns": ["figure", "value", "ratio to baseline", "goal", "met"],
                "rows": [
                    ["loop without updates, per item", f"{item_ns:,.0f} ns", "1.000", "", ""],
                    [
                        "one `advance()` per item: its cost (tight loop) over the item's",
                        f"{adv_ns:,.0f} ns",
                        f"{1 + per_call:.4f}",
                        "< 1.010",
                        "yes" if ok else "no",
                    ],
                    [
                        "loop with one `advance()` per item, paired (median; quartiles)",
                        f"{item_ns * (1 + slowdown):,.0f} ns",
                        f"{1 + slowdown:.4f} ({1 + quartiles[0]:.3f} / {1 + quartiles[1]:.3f})",
                        "",
                        "",
                    ],
                    ["slowdown", f"{per_call * 100:.2f} %", "", "< 1 %", "yes" if ok else "no"],
                ],
            },
            {
                "title": "Cost per update in a tight loop (ns above a bare loop iteration)",
                "columns": ["update", "ns per call", "ratio to `RawValue` store", "reference"],
                "rows": [
                    ["bare loop iteration (itself)", f"{m['bare']:.1f}", "", "~25 ns"],
                    ["`RawValue.value = i`", f"{raw_ns:.1f}", "1.00", "~40 ns more"],
                    [
                        "ctypes `c_int64 += 1` over shared memory",
                        f"{ct_ns:.1f}",
                        f"{ct_ns / raw_ns:.2f}",
                        "~120 ns more",
                    ],
                    [
                        "`ProgressCell.advance()`",
                        f"{adv_ns:.1f}",
                        f"{adv_ns / raw_ns:.2f}",
                        "well under 1 µs",
                    ],
                ],
            },
        ],
        "plots": [
            {
                "file": "progress_overhead.png",
                "kind": "barh",
                "title": "ns per update (above a bare loop iteration)",
                "xlabel": "ns per call",
                "labels": ["RawValue store", "ctypes += 1 (shm)", "ProgressCell.advance()"],
                "values": [raw_ns, ct_ns, adv_ns],
            }
        ],
        "data": {
            "kernel_iterations": k,
            "item_ns": item_ns,
            "items": items,
            "repeats": repeats,
            "plain_ns": plain,
            "cell_ns": with_cell,
            "paired_ratios": ratios,
            "slowdown": slowdown,
            "slowdown_quartiles": list(quartiles),
            "per_call_slowdown": per_call,
            "micro_ns": m,
            "advance_ns": adv_ns,
            "rawvalue_ns": raw_ns,
            "ctypes_ns": ct_ns,
        },
        "findings": findings,
        "goals": {"slowdown < 1 %": ok},
    }


def main() -> None:
    import json

    print(json.dumps(run(quick=True)["data"], indent=1)[:2000])


if __name__ == "__main__":
    main()
