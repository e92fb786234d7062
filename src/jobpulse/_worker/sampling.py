"""Process sampling (psutil) and rate/ETA estimation — done at beat time, never in the work.

Both are plain synchronous objects: :class:`RateWindow` is pure arithmetic over the samples it
is given (no clock of its own), :class:`ProcessSampler` asks psutil and caches for ``max_age``
seconds so that many jobs beating in one tick share one sample.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import psutil

__all__ = ["ProcessSample", "ProcessSampler", "RateWindow"]

log = logging.getLogger("jobpulse")


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """Resident memory and CPU time of this process plus its child processes (executor pools)."""

    rss_bytes: int
    cpu_seconds: float


class ProcessSampler:
    """Samples this process and its children; one sample serves every beat within ``max_age``.

    Args:
        clock: a monotonic clock in seconds.
        max_age: how long a sample is reused.
        pid: the process to sample (default: this one; the sidecar helper samples its owner).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        max_age: float = 0.5,
        pid: int | None = None,
        children_every: float = 5.0,
    ) -> None:
        self._clock = clock
        self._max_age = max_age
        # Listing the children reads every process's /proc entry (psutil's ppid map): the
        # costliest part of a sample by far on a busy host. The known children are measured at
        # every sample; the list itself is refreshed this often (a new pool child counts
        # within this many seconds).
        self._children_every = children_every
        self._children_at = float("-inf")
        self._pid = os.getpid() if pid is None else pid
        self._proc = psutil.Process(self._pid)
        self._children: dict[int, psutil.Process] = {}
        self._at = float("-inf")
        self._last = ProcessSample(0, 0.0)

    def sample(self) -> ProcessSample:
        now = self._clock()
        if now - self._at < self._max_age:
            return self._last
        self._at = now
        try:
            self._last = self._measure()
        except (psutil.Error, OSError) as exc:  # e.g. EMFILE: keep the last sample, never crash
            log.debug("process sample failed, keeping the last one: %r", exc)
        return self._last

    def _measure(self) -> ProcessSample:
        rss = 0
        cpu = 0.0
        procs = [self._proc]
        if self._at - self._children_at >= self._children_every:
            self._children_at = self._at
            with contextlib.suppress(psutil.Error):
                # Keep the Process objects of live children: psutil caches their identity.
                live = {}
                for child in self._proc.children(recursive=True):
                    live[child.pid] = self._children.get(child.pid, child)
                self._children = live
        procs.extend(self._children.values())
        for proc in procs:
            with contextlib.suppress(psutil.Error), proc.oneshot():
                rss += proc.memory_info().rss
                t = proc.cpu_times()
                cpu += t.user + t.system
        return ProcessSample(rss, cpu)


class RateWindow:
    """Items per second over a sliding window of ``(time, done)`` samples, and the ETA.

    Args:
        window: seconds of history the rate is computed over.
    """

    def __init__(self, window: float = 10.0) -> None:
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        """Record ``done`` at monotonic time ``now`` (a lower ``done`` restarts the window)."""
        if self._samples and done < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Items per second over the window, or None before two samples span some time."""
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return (d1 - d0) / (t1 - t0)

    def eta(self, done: int, total: int | None, rate: float | None = None) -> float | None:
        """Seconds left at the current rate (``rate``: :meth:`rate`'s answer, when the caller
        already has it), or None when unknown (no total, or no progress)."""
        if rate is None:
            rate = self.rate()
        if total is None or rate is None or rate <= 0:
            return None
        return max(total - done, 0) / rate
