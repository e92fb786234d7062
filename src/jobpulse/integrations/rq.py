"""RQ integration: every job runs under a ``jobpulse.sync`` heartbeat in its work horse.

Install it as the worker class (``pip install "jobpulse[rq]"``)::

    # myapp/worker.py
    from jobpulse.integrations.rq import worker_class

    JobpulseWorker = worker_class(ttl=6.0)

    # shell: rq worker -w myapp.worker.JobpulseWorker --maintenance-interval 10 \
    #            --worker-ttl 25 reports

Each job then runs inside ``jobpulse.sync.heartbeat(connection, job_id_for(job.id),
kind=job.func_name)``, entered in the process that runs the job (the forked work horse;
``jobpulse.current()`` is that heartbeat there) when ``job.perform()`` starts, and left once RQ
recorded the job: jobpulse's final write comes after RQ's result.

Claim: RQ takes a job as abandoned once its StartedJobRegistry entry expires (the worker's main
process refreshes it every ``job_monitoring_interval``, with a TTL of that plus 60 s); the next
maintenance run (every ``maintenance_interval``, 10 min by default) of any worker then retries
it (``retries_left``) or fails it with ``AbandonedJobError``. With this worker class the entry's
TTL is ``ceil(ttl + interval) + 1`` seconds and it is refreshed every ``interval`` while the
heartbeat holds the lease, so a dead job is abandoned seconds after its horse died.
The worker's own key keeps RQ's ``job_monitoring_interval + 60`` seconds while a job runs, so a
busy worker stays in RQ's worker registry.

Sidecar (the default): the job's beats and that refresh go out from jobpulse's helper process,
started by the work horse and ending with it, so a job that holds the GIL in the horse is never
abandoned for it; ``sidecar=False`` sends both from threads of the horse.

Owner death: the work horse holds the heartbeat, and it belongs to the worker's main process.
When the main process dies (SIGKILL), the horse notices within ``interval`` (its parent changed)
and ends itself at once with ``os._exit``: nothing of the job is written by it (no FINISHED over a
re-run), jobpulse shows the job STALE within ``ttl``, and RQ's maintenance retries it once.

Cancel: ``jobpulse.request_cancel()`` reaches the job through ``current().check()``, which raises
``JobCancelled``; RQ records the job FAILED with that exception (and retries it only if it has
``retries_left``) and jobpulse records CANCELLED.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.worker import Worker

from ._common import HelperClaim, PulseOptions, job_id_for, leave_recorded, pulse_sync

__all__ = ["worker_class"]


def worker_class(
    base: type[Worker] = Worker,
    *,
    interval: float = 1.0,
    ttl: float = 6.0,
    namespace: str = "jobpulse",
    redis: Any = None,
    sidecar: bool = True,
) -> type[Worker]:
    """An RQ worker class (a subclass of ``base``) that runs every job under a heartbeat.

    Args:
        base: the RQ worker class to extend (``Worker``, ``SimpleWorker``, ...).
        interval: seconds between beats and between refreshes of the job's StartedJobRegistry
            entry.
        ttl: the heartbeat's lease time; the registry entry is kept at ``ceil(ttl + interval) + 1``
            seconds.
        namespace: jobpulse's key prefix.
        redis: the ``redis.Redis`` client jobpulse writes to; None uses the worker's connection.
        sidecar: True (the default): each job's beats, and the refresh of its
            StartedJobRegistry entry, go out from jobpulse's helper process (one per work
            horse), so a body that holds the GIL delays neither; False: from threads of the
            work horse. With True, ``redis`` must be a client jobpulse can rebuild there (a
            plain ``redis.Redis``; TypeError here otherwise).

    Returns:
        The worker class, to pass as ``rq worker -w`` or to instantiate.

    Raises:
        ValueError, TypeError: an option is out of range (checked here, before any Redis command).
    """
    options = PulseOptions(
        interval=interval, ttl=ttl, namespace=namespace, redis=redis, sidecar=sidecar
    )
    claim = math.ceil(options.claim_ttl) + 1

    class JobpulseWorker(base):  # type: ignore[valid-type,misc]
        """An RQ worker whose jobs run under a jobpulse heartbeat (see jobpulse.integrations.rq)."""

        def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
            return claim

        def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
            # RQ also gives get_heartbeat_ttl() (the claim, seconds) to the worker's own key when
            # a job starts, and refreshes that key only every job_monitoring_interval: it would
            # expire mid-job and maintenance would drop the worker from rq:workers for good.
            # The worker's key keeps at least what RQ gives it while a job runs.
            if timeout is not None:
                timeout = max(timeout, self.job_monitoring_interval + 60)
            super().heartbeat(timeout, pipeline=pipeline)

        def perform_job(self, job: Job, queue: Any, execution: Any) -> bool:
            perform = job.perform
            parent = os.getppid() if getattr(self, "_is_horse", False) else None
            connection = self.connection
            held = contextlib.ExitStack()  # the job's heartbeat, from the body's start
            ended: list[BaseException | None] = []  # how the body ended

            def orphaned() -> None:
                if parent is not None and os.getppid() != parent:
                    os._exit(1)  # the main process died: this orphan must write nothing more

            def refresh() -> None:
                with connection.pipeline() as pipe:
                    execution.heartbeat(job.started_job_registry, claim, pipeline=pipe)
                    pipe.execute()

            beat = functools.partial(_heartbeat, job.id, execution.id, job.origin, claim)
            kept = HelperClaim.of(connection, beat, options.interval, job_id_for(job.id))

            def run() -> Any:
                name = job.func_name or ""
                held.enter_context(
                    pulse_sync(
                        options, connection, job.id, name, refresh, watch=orphaned, claim=kept
                    )
                )
                try:
                    value = perform()
                except BaseException as exc:
                    ended.append(exc)
                    raise
                ended.append(None)
                return value

            job.perform = run  # type: ignore[method-assign]
            try:
                return bool(super().perform_job(job, queue, execution))
            finally:
                # after RQ recorded the job's result or failure: jobpulse's final write is last
                leave_recorded(held, ended[0] if ended else None, job.id)

    return JobpulseWorker


def _heartbeat(job_id: str, execution_id: str, origin: str, ttl: int, connection: Any) -> None:
    """(In the sidecar helper) RQ's own refresh of an execution's StartedJobRegistry entry,
    rebuilt from ids: what ``Execution.heartbeat`` does in the work horse."""
    execution = Execution(id=execution_id, job_id=job_id, connection=connection)
    with connection.pipeline() as pipe:
        execution.heartbeat(StartedJobRegistry(origin, connection=connection), ttl, pipeline=pipe)
        pipe.execute()
