"""``current()``: the heartbeat of the job running in this asyncio task or thread.

A ``ContextVar`` holds it: an asyncio task sees the heartbeat its own ``async with`` entered (and
tasks it creates inside the body inherit it, since a new task copies the context); a thread sees
the heartbeat entered in that thread. Code run by ``loop.run_in_executor`` does not inherit the
context: hand it ``hb.progress`` instead.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from .heartbeat import JobHeartbeat
    from .sidecar.job import AsyncSidecarHeartbeat, SidecarHeartbeat
    from .sync_heartbeat import SyncHeartbeat

    Current: TypeAlias = JobHeartbeat | SyncHeartbeat | AsyncSidecarHeartbeat | SidecarHeartbeat

__all__ = ["current", "enter_current", "leave_current"]

_CURRENT: ContextVar[Current | None] = ContextVar("jobpulse_current", default=None)


def current() -> Current | None:
    """The heartbeat of the job running in this asyncio task (a :class:`~jobpulse.JobHeartbeat`)
    or thread (a :class:`jobpulse.sync.SyncHeartbeat`), else None; with ``sidecar=True`` it is
    the owner's proxy of the job (the same public members).

    Library code and queue integrations reach the running job's heartbeat through it without
    being handed it: ``hb = jobpulse.current()``; ``if hb is not None: hb.set_stage("load")``.
    Inside nested heartbeats it is the innermost one.
    """
    return _CURRENT.get()


def enter_current(hb: Current) -> Token[Current | None]:
    """Make ``hb`` current in this context; pass the token to :func:`leave_current` at exit."""
    return _CURRENT.set(hb)


def leave_current(token: Token[Current | None] | None) -> None:
    """Restore what was current before the matching :func:`enter_current`."""
    if token is not None:
        # exited in another context than it was entered in: nothing there to undo
        with contextlib.suppress(ValueError):
            _CURRENT.reset(token)
