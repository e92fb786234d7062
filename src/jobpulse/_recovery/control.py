"""Remote control of a running job."""

from __future__ import annotations

from typing import Any

from .._protocol import calls
from .._protocol.codec import dump_json
from .._protocol.keys import KeySchema

__all__ = ["request_cancel"]


async def request_cancel(
    redis: Any,
    job_id: str,
    *,
    namespace: str = "jobpulse",
    reason: str | None = None,
    maxlen: int = 1000,
) -> bool:
    """Ask the worker of a running job to stop.

    The request is recorded atomically (the snapshot's ``cancel`` field and a ``cancel`` stream
    entry). The worker learns it from its next beat's reply, sets ``progress.cancelled``,
    cancels its body, and the job ends CANCELLED.

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
    """
    keys = KeySchema(namespace).job(job_id).all()
    details = "" if reason is None else dump_json({"reason": reason}, limit=4096, name="reason")
    code = await calls.run(redis, calls.cancel(keys, maxlen, details))
    return code is not calls.CancelCode.NOT_RUNNING
