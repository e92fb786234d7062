"""``Backoff``: the polling schedule for clients that cannot follow the stream."""

from __future__ import annotations

import random
from collections.abc import Iterator

from .._checks import check_number

__all__ = ["Backoff"]


def _number(name: str, value: object) -> float:
    return float(check_number(name, value))


class Backoff(Iterator[float]):
    """An endless iterator of polling delays in seconds: ``start``, growing by ``factor`` per
    step up to ``cap``, each spread by ``±jitter`` (a fraction) and never above ``cap``.

    With the defaults the base schedule is 0.5, 0.75, 1.125, 1.6875, 2.53, 3.8, 5.0, 5.0, … s;
    jitter spreads each delay uniformly over ``base * (1 ± 0.1)`` so a herd of pollers that
    started together drifts apart. The same schedule for browsers is in ``docs/reader.md``.

    Args:
        start: the first delay (> 0).
        cap: the largest delay (>= ``start``).
        factor: growth per step (>= 1).
        jitter: the spread, a fraction in ``[0, 1)``; 0 gives the exact base schedule.
        rng: the random source (a ``random.Random``; seed one for reproducible delays).

    Raises:
        ValueError: an argument is out of range (the message names it).
        TypeError: an argument is not a number.
    """

    __slots__ = ("_base", "_rng", "cap", "factor", "jitter", "start")

    def __init__(
        self,
        start: float = 0.5,
        cap: float = 5.0,
        factor: float = 1.5,
        jitter: float = 0.1,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.start = _number("start", start)
        self.cap = _number("cap", cap)
        self.factor = _number("factor", factor)
        self.jitter = _number("jitter", jitter)
        if self.start <= 0:
            raise ValueError(f"start must be > 0, got {start!r}")
        if self.cap < self.start:
            raise ValueError(f"cap must be >= start ({start!r}), got {cap!r}")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
        self._rng = rng if rng is not None else random.Random()
        self._base = self.start

    def __iter__(self) -> Backoff:
        return self

    def __next__(self) -> float:
        base = self._base
        self._base = min(base * self.factor, self.cap)
        if not self.jitter:
            return base
        spread = 1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)
        return min(base * spread, self.cap)

    def reset(self) -> None:
        """Start the schedule again from ``start`` (e.g. after the job made progress)."""
        self._base = self.start

    def __repr__(self) -> str:
        return (
            f"Backoff(start={self.start}, cap={self.cap}, factor={self.factor}, "
            f"jitter={self.jitter})"
        )
