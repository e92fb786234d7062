"""The ``jobpulse`` command line: ``status``, ``watch``, ``ls``, ``sweep``, ``cancel``, ``demo``,
``serve``. A thin adapter over the public API; see docs/cli.md."""

from __future__ import annotations

from .app import main as main

__all__ = ["main"]
