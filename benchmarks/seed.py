"""The seed's pattern, implemented faithfully in Python with redis-py (asyncio).

The seed (a Go sketch) takes a lock with ``SET lock NX PX ttl`` and then runs one background
heartbeat per job that, every tick: (1) runs a Lua renew script (``if GET lock == val then
PEXPIRE``), one round trip; (2) samples memory; (3) sends a pipeline of ``HSET`` (progress,
stage, alloc_mb, last_heartbeat, status) and ``EXPIRE 1h`` on ``job:telemetry:<id>``, a second
round trip. The job releases the lock with a compare-and-delete script and writes COMPLETED.
Keys, fields and command shapes follow the sketch; go-redis's ``Script.Run`` is EVALSHA (with
an EVAL fallback), which redis-py's registered scripts also do.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psutil

__all__ = ["SeedJob"]

RENEW = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("pexpire", KEYS[1], ARGV[2])
else
    return 0
end
"""

RELEASE = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end
"""

_PROC = psutil.Process()


class SeedJob:
    """One job under the seed's heartbeat: ``async with SeedJob(redis, id, ...)``.

    Attributes:
        progress: the value the computation sets (the seed's ``atomic.Int64``).
        beats: heartbeats sent (renew + pipeline each).
    """

    def __init__(self, redis: Any, job_id: str, *, interval: float = 2.0, ttl: float = 6.0):
        self.redis = redis
        self.job_id = job_id
        self.interval = interval
        self.ttl_ms = int(ttl * 1000)
        self.lock_key = f"lock:job:{job_id}"
        self.hash_key = f"job:telemetry:{job_id}"
        self.lock_val = f"node-worker-{time.time_ns()}-{os.getpid()}"
        self.progress = 0
        self.stage = "INITIALIZING"
        self.beats = 0
        self.lost = False
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> SeedJob:
        ok = await self.redis.set(self.lock_key, self.lock_val, nx=True, px=self.ttl_ms)
        if not ok:
            raise RuntimeError("unable to acquire distributed lock")
        self._task = asyncio.get_running_loop().create_task(self._heartbeat())
        return self

    async def __aexit__(self, *exc: object) -> None:
        # close(done) in the Go sketch: a flag, not a cancel() (redis-py can turn a cancel that
        # lands mid-command into a connection error, which the loop below would swallow)
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.redis.hset(self.hash_key, "status", "COMPLETED")
        await self._release(keys=[self.lock_key], args=[self.lock_val])

    async def beat(self) -> bool:
        """One heartbeat: the renew script, then the pipelined HSET + EXPIRE."""
        res = await self._renew(keys=[self.lock_key], args=[self.lock_val, self.ttl_ms])
        if int(res) == 0:
            self.lost = True
            return False
        alloc_mb = _PROC.memory_info().rss // 1024 // 1024  # runtime.ReadMemStats
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            self.hash_key,
            mapping={
                "progress": self.progress,
                "stage": self.stage,
                "alloc_mb": alloc_mb,
                "last_heartbeat": int(time.time()),
                "status": "RUNNING",
            },
        )
        pipe.expire(self.hash_key, 3600)
        await pipe.execute()
        self.beats += 1
        return True

    async def _heartbeat(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval):
                    await self._stop.wait()
                return
            except TimeoutError:
                pass
            try:
                if not await self.beat():
                    return
            except Exception:  # the seed ignores pipeline errors and goes on
                continue
