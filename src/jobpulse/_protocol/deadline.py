"""Await redis-py so that time bounds and cancellations hold on Python 3.11.

redis-py 8 sends every command through ``asyncio.wait_for`` (its default ``socket_timeout`` is
5 s). On CPython 3.11, ``wait_for`` returns the inner result and drops the caller's
cancellation when both happen in the same loop iteration (gh-86296; 3.12 rewrote ``wait_for``
on ``asyncio.timeout``). An ``asyncio.timeout`` around such a call then expires without
raising: measured here, ``asyncio.timeout(0.0005)`` around ``Sweeper.sweep()`` behind a 0.2 s
proxy ran 0.4 to 1.2 s and raised nothing in about 3 tries in 10.

:func:`cancellable` runs the call in a task of its own and waits on that task with
``asyncio.wait``, which never swallows a cancellation: the caller's ``asyncio.timeout`` (ours or
the user's) fires on time. The child task is then cancelled, and cancelled again every
``RECANCEL`` seconds until it ends, since it may itself swallow one cancellation in
``wait_for``. anyio's cancel scopes re-deliver a cancellation the same way; one small function
here does it without putting anyio between jobpulse and the user's event loop.

On 3.12 and later ``wait_for`` no longer swallows, and this costs one task per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["RECANCEL", "cancellable"]

T = TypeVar("T")

RECANCEL = 0.01
"""Seconds between two cancellations of an abandoned call that has not ended yet."""


async def cancellable(call: Awaitable[T]) -> T:
    """Await ``call`` (a redis-py coroutine, or a loop of them) so that cancelling the caller,
    e.g. by an enclosing ``asyncio.timeout``, always takes effect at once.

    Returns the call's result, or raises its exception. When the caller is cancelled, the call
    is cancelled until it ends, in the background, and ``CancelledError`` propagates.
    """
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait((task,))
    except BaseException:
        _abandon(task)
        raise
    return task.result()


def _abandon(task: asyncio.Future[T]) -> None:
    """Cancel ``task`` until it ends; retrieve its outcome so nothing is logged as lost."""
    if task.done():
        if not task.cancelled():
            task.exception()
        return
    task.cancel()
    task.add_done_callback(_retrieve)
    asyncio.get_running_loop().call_later(RECANCEL, _recancel, task)


def _recancel(task: asyncio.Future[T]) -> None:
    if not task.done():
        task.cancel()
        asyncio.get_running_loop().call_later(RECANCEL, _recancel, task)


def _retrieve(task: asyncio.Future[T]) -> None:
    if not task.cancelled():
        task.exception()
