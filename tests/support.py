"""Helpers shared by the tests (no fixtures here: those live in conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    predicate: Callable[[], Awaitable[T]], within: float = 10.0, step: float = 0.02
) -> T:
    """Await ``predicate()`` until it returns a truthy value, and return that value.

    Raises TimeoutError after ``within`` seconds: the condition never held.
    """
    async with asyncio.timeout(within):
        while True:
            value = await predicate()
            if value:
                return value
            await asyncio.sleep(step)
