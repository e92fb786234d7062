"""Encode and decode snapshot and event values (pure functions, no I/O).

Snapshot fields are plain decimal or UTF-8 strings; an absent value is the empty string.
``meta`` and event ``details`` are JSON (orjson), size-limited and refused, never truncated.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

__all__ = [
    "DYNAMIC_FIELDS",
    "SNAPSHOT_FIELDS",
    "TERMINAL_STATUSES",
    "dump_json",
    "fmt_float",
    "fmt_int",
    "load_json",
]

SNAPSHOT_FIELDS: tuple[str, ...] = (
    "status", "stage", "done", "total", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms",
    "seq", "fence", "attempt", "worker", "started_ms", "heartbeat_ms", "progress_ms",
    "finished_ms", "error", "meta",
)  # fmt: skip
"""The contract's snapshot fields (section 3), in the documented order."""

DYNAMIC_FIELDS: tuple[str, ...] = (
    "done", "total", "stage", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms",
)  # fmt: skip
"""The fields every beat sends, positionally, in this order (``DYNAMIC`` in ``_lib.lua``)."""

TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "LOST"})


def fmt_int(value: int | None) -> str:
    """An integer as a decimal string; None as ``""``."""
    return "" if value is None else str(int(value))


def fmt_float(value: float | None, digits: int = 3) -> str:
    """A finite float rounded to ``digits`` decimals, trailing zeros dropped; else ``""``."""
    if value is None or not math.isfinite(value):
        return ""
    text = f"{value:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def dump_json(value: Any, *, limit: int, name: str) -> str:
    """Serialise ``value`` to compact JSON, refusing what is not serialisable or too large.

    Raises:
        TypeError: ``value`` is not JSON-serialisable (the message names ``name``).
        ValueError: the JSON is longer than ``limit`` bytes (the message names ``name``).
    """
    try:
        raw = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"{name} must be JSON-serialisable: {exc}") from None
    if len(raw) > limit:
        raise ValueError(f"{name} is {len(raw)} bytes of JSON, over the limit of {limit} bytes")
    return raw.decode()


def load_json(text: str | bytes | None) -> Any:
    """Parse JSON text; ``None`` or empty gives ``None``. Raises ``orjson.JSONDecodeError``."""
    if not text:
        return None
    return orjson.loads(text)
