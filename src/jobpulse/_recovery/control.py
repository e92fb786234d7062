"""Remote control of a running job.

Both shells send the same typed call (:func:`cancel_call`, ``cancel.lua``): the asyncio
:func:`request_cancel` through ``calls.run``, the blocking :func:`request_cancel_sync`
(``jobpulse.sync.request_cancel``) through ``calls.run_sync``. Only the driver differs.
"""

from __future__ import annotations

from typing import Any

from .._protocol import calls
from .._protocol.clients import AsyncClient, SyncClient
from .._protocol.codec import dump_json
from .._protocol.keys import KeySchema

__all__ = ["cancel_call", "request_cancel", "request_cancel_sync"]


def cancel_call(
    job_id: str, *, namespace: str, reason: str | None, maxlen: int
) -> calls.Call[calls.CancelCode]:
    """The cancel request of ``job_id``, checked and encoded before any Redis call.

    Raises:
        InvalidJobId: the job id or namespace is invalid.
        ValueError: ``maxlen`` is not a positive integer, or ``reason`` is too long.
    """
    keys = KeySchema(namespace).job(job_id).all()
    if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
        raise ValueError(f"maxlen must be a positive integer, got {maxlen!r}")
    details = "" if reason is None else dump_json({"reason": reason}, limit=4096, name="reason")
    return calls.cancel(keys, maxlen, details)


def _requested(code: calls.CancelCode) -> bool:
    return code is not calls.CancelCode.NOT_RUNNING


async def request_cancel(
    redis: AsyncClient,
    job_id: str,
    *,
    namespace: str = "jobpulse",
    reason: str | None = None,
    maxlen: int = 1000,
) -> bool:
    """Ask the worker of a running job to stop.

    The request is recorded atomically (the snapshot's ``cancel`` field and a ``cancel`` stream
    entry). The worker learns it from its next beat's reply, sets ``progress.cancelled``,
    cancels its body, and the job ends CANCELLED. Sync code calls
    :func:`jobpulse.sync.request_cancel` (the same call on a blocking client).

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``.
        job_id: the job.
        namespace: the key prefix.
        reason: optional text recorded in the ``cancel`` entry's details.
        maxlen: the events stream cap.

    Returns:
        True when the job was RUNNING and the request is (or already was) recorded; False when
        the job is unknown or has already ended.

    Raises:
        InvalidJobId: the job id or namespace is invalid (before any Redis call).
        ValueError: ``maxlen`` or ``reason`` is out of range (before any Redis call).
    """
    call = cancel_call(job_id, namespace=namespace, reason=reason, maxlen=maxlen)
    client: Any = redis  # redis-py's cluster clients do not spell calls' protocol exactly
    return _requested(await calls.run(client, call))


def request_cancel_sync(
    redis: SyncClient,
    job_id: str,
    *,
    namespace: str = "jobpulse",
    reason: str | None = None,
    maxlen: int = 1000,
) -> bool:
    """Ask the worker of a running job to stop, from sync code (no event loop needed).

    ``jobpulse.sync.request_cancel``: the same request as :func:`jobpulse.request_cancel`
    (one ``cancel.lua`` call, recorded atomically), sent on a blocking client. A sync body
    learns it from ``hb.check()`` / ``hb.cancelled``; an asyncio body is cancelled.

    Args:
        redis: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        job_id: the job.
        namespace: the key prefix.
        reason: optional text recorded in the ``cancel`` entry's details.
        maxlen: the events stream cap.

    Returns:
        True when the job was RUNNING and the request is (or already was) recorded; False when
        the job is unknown or has already ended.

    Raises:
        InvalidJobId: the job id or namespace is invalid (before any Redis call).
        ValueError: ``maxlen`` or ``reason`` is out of range (before any Redis call).
    """
    call = cancel_call(job_id, namespace=namespace, reason=reason, maxlen=maxlen)
    client: Any = redis
    return _requested(calls.run_sync(client, call))
