"""Checked, immutable worker configuration."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .._checks import check_number
from .options import HeartbeatSpec

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_KIND_CHARS",
    "MAX_STAGE_CHARS",
    "HeartbeatConfig",
    "check_kind",
    "check_stage",
    "check_total",
]

MAX_STAGE_CHARS = 200
"""Stage names are 1 to 200 printable characters."""

MAX_KIND_CHARS = 100
"""A job kind is 0 to 100 characters of ``A-Z a-z 0-9 . _ - : /`` (``""``: no kind)."""

_KIND = re.compile(rf"[A-Za-z0-9._\-:/]{{0,{MAX_KIND_CHARS}}}")

MAX_ERROR_CHARS = 1000
"""A FAILED job's ``error`` (``"Type: message"``) is cut to this many characters."""


_DEFAULTS = HeartbeatSpec()


def _positive(name: str, value: object, *, integer: bool = False) -> None:
    check_number(name, value, integer=integer, minimum=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatConfig:
    """How a job's heartbeat behaves. Every field is checked on construction.

    Attributes:
        interval: seconds between beats (> 0).
        ttl: lease and liveness time in seconds (>= 2 * interval).
        stream_every: a plain ``beat`` stream entry at most every this many beats (>= 1).
        maxlen: the events stream is capped with ``MAXLEN ~`` this (>= 1).
        retention: seconds the snapshot and stream are kept after the end (> 0).
        max_meta_bytes: size limit of ``meta`` as JSON (> 0).
        max_details_bytes: size limit of checkpoint details as JSON (> 0).
        final_timeout: seconds the final write keeps retrying while Redis is unreachable (> 0).
        index_every: the running-jobs index entry is refreshed every this many beats (>= 1).
    """

    # the defaults are the heartbeat's (options.py declares each once)
    interval: float = _DEFAULTS.interval
    ttl: float = _DEFAULTS.ttl
    stream_every: int = _DEFAULTS.stream_every
    maxlen: int = _DEFAULTS.maxlen
    retention: float = _DEFAULTS.retention
    max_meta_bytes: int = _DEFAULTS.max_meta_bytes
    max_details_bytes: int = _DEFAULTS.max_details_bytes
    final_timeout: float = _DEFAULTS.final_timeout
    index_every: int = _DEFAULTS.index_every

    def __post_init__(self) -> None:
        _positive("interval", self.interval)
        _positive("ttl", self.ttl)
        if self.ttl < 2 * self.interval:
            raise ValueError(
                f"ttl must be >= 2 * interval, got ttl={self.ttl} interval={self.interval}"
            )
        for name in (
            "stream_every",
            "maxlen",
            "max_meta_bytes",
            "max_details_bytes",
            "index_every",
        ):
            _positive(name, getattr(self, name), integer=True)
        _positive("retention", self.retention)
        _positive("final_timeout", self.final_timeout)

    @property
    def ttl_ms(self) -> int:
        return math.ceil(self.ttl * 1000)

    @property
    def index_horizon(self) -> float:
        """Seconds an index entry stays ahead of the clock: refresh period plus lease."""
        return self.index_every * self.interval + self.ttl


def check_stage(stage: object) -> str:
    """Return ``stage`` when it is 1 to 200 printable characters, else raise."""
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a str, got {type(stage).__name__}")
    if not 1 <= len(stage) <= MAX_STAGE_CHARS or not stage.isprintable():
        raise ValueError(
            f"stage must be 1 to {MAX_STAGE_CHARS} printable characters, got {stage[:50]!r}"
        )
    return stage


def check_kind(kind: object) -> str:
    """Return ``kind`` when it is 0 to 100 characters of ``A-Z a-z 0-9 . _ - : /``, else raise.

    A kind names a class of jobs (``"report"``, a queue's task name): metrics aggregate by it, so
    it must stay low-cardinality — never put a job id in it.
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type(kind).__name__}")
    if _KIND.fullmatch(kind) is None:
        raise ValueError(
            f"kind must be 0 to {MAX_KIND_CHARS} characters of A-Z a-z 0-9 . _ - : /, "
            f"got {kind[:50]!r}"
        )
    return kind


def check_total(total: object) -> int | None:
    """Return ``total`` when it is None or an int >= 0, else raise."""
    if total is None:
        return None
    if isinstance(total, bool) or not isinstance(total, int):
        raise TypeError(f"total must be an int or None, got {total!r}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    return total
