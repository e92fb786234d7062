"""Encode and decode snapshot and event values (pure functions, no I/O).

Snapshot fields are plain decimal or UTF-8 strings; an absent value is the empty string.
``meta`` and event ``details`` are JSON (orjson), size-limited and refused, never truncated.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

__all__ = [
    "DYNAMIC_FIELDS",
    "EVENT_KINDS",
    "SNAPSHOT_FIELDS",
    "STATUSES",
    "TERMINAL_EVENT_KINDS",
    "TERMINAL_STATUSES",
    "decode_entry",
    "dump_json",
    "fmt_float",
    "fmt_int",
    "load_json",
    "parse_stream_id",
    "text",
    "to_text",
]

SNAPSHOT_FIELDS: tuple[str, ...] = (
    "status", "stage", "done", "total", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms",
    "seq", "fence", "attempt", "worker", "started_ms", "heartbeat_ms", "progress_ms",
    "finished_ms", "error", "meta", "kind",
)  # fmt: skip
"""The contract's snapshot fields (section 3), in the documented order."""

DYNAMIC_FIELDS: tuple[str, ...] = (
    "done", "total", "stage", "rate", "eta_s", "rss_bytes", "cpu_s", "loop_lag_ms",
)  # fmt: skip
"""The fields every beat sends, positionally, in this order (``DYNAMIC`` in ``_lib.lua``)."""

TERMINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "LOST"})

STATUSES = frozenset({"RUNNING"}) | TERMINAL_STATUSES
"""Every value the scripts write into a snapshot's ``status`` (STALE is derived, never written)."""

EVENT_KINDS = frozenset({"start", "stage", "beat", "checkpoint", "cancel", "end", "stale"})
"""Every ``kind`` of a stream entry."""

_STREAM_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")

TERMINAL_EVENT_KINDS = frozenset({"end", "stale"})
"""The kinds after which a job's stream gets no entry of the same attempt."""


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


def text(value: Any) -> str:
    """A reply element as text, whatever it is: bytes decoded (redis-py answers bytes unless
    ``decode_responses``), anything else through ``str()`` (an integer reply element). Unlike
    :func:`to_text`, ``""`` stays ``""``: for ids, members and script replies, not field values.

    Raises:
        UnicodeDecodeError: ``value`` is bytes that are not UTF-8.
    """
    return value.decode() if isinstance(value, bytes) else str(value)


def to_text(value: str | bytes | None) -> str | None:
    """A reply value as text; ``None`` and ``""`` (the protocol's "absent") give ``None``.

    Raises:
        UnicodeDecodeError: ``value`` is bytes that are not UTF-8.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode()
    return value or None


def decode_entry(fields: Any) -> dict[str, str]:
    """The field/value pairs of a stream entry as a ``str`` dict (absent values omitted).

    ``fields`` is what redis-py returns for one entry: a mapping (or a flat list) of bytes or
    str, with or without ``decode_responses``.
    """
    if not hasattr(fields, "items"):
        it = iter(fields)
        fields = dict(zip(it, it, strict=True))
    out: dict[str, str] = {}
    for key, value in fields.items():
        name, text = to_text(key), to_text(value)
        if name is not None and text is not None:
            out[name] = text
    return out


def parse_stream_id(value: str | bytes) -> tuple[int, int]:
    """A stream entry id (``"1700000000000-3"``, or ``"1700000000000"``) as ``(ms, seq)``.

    Raises:
        ValueError: ``value`` is not a stream id.
    """
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    match = _STREAM_ID.fullmatch(text)
    if match is None:
        raise ValueError(f"not a stream id: {text!r}")
    return int(match[1]), int(match[2] or 0)
