"""A warning that is logged at most once per period, with a count of what it held back."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """Log a recurring warning at most once every ``period`` seconds.

    Args:
        logger: where to log.
        clock: a monotonic clock in seconds.
        period: minimum seconds between two lines.
    """

    def __init__(self, logger: logging.Logger, clock: Callable[[], float], period: float = 10.0):
        self._logger = logger
        self._clock = clock
        self._period = period
        self._last = float("-inf")
        self._held = 0

    def warning(self, msg: str, *args: object) -> bool:
        """Log ``msg`` unless one was logged within the period; True when it was logged."""
        now = self._clock()
        if now - self._last < self._period:
            self._held += 1
            return False
        if self._held:
            msg += " (%d similar warnings suppressed)"
            args = (*args, self._held)
        self._logger.warning(msg, *args)
        self._last = now
        self._held = 0
        return True
