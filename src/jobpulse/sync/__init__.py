"""jobpulse for sync code: a thread shell over the same beat state machine and protocol.

``heartbeat(client, job_id, ...)`` is a context manager for a job whose body is blocking code
(RQ, Celery prefork, Dramatiq threads, Django or Flask); ``StatusReader(client)`` reads jobs
from sync code; ``request_cancel(client, job_id)`` asks a running job to stop, without an event
loop. ``client`` is a ``redis.Redis`` or ``redis.cluster.RedisCluster``. See ``docs/sync.md``.
"""

from .._reader.sync_reader import SyncStatusReader as StatusReader
from .._recovery.control import request_cancel_sync as request_cancel
from .._worker.sidecar.job import SidecarHeartbeat as SidecarHeartbeat
from .._worker.sync_heartbeat import SyncHeartbeat as SyncHeartbeat
from .._worker.sync_heartbeat import heartbeat as heartbeat

__all__ = ("SidecarHeartbeat", "StatusReader", "SyncHeartbeat", "heartbeat", "request_cancel")
