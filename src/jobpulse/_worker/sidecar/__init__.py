"""The sidecar: a job's beats sent by a helper process (``heartbeat(..., sidecar=True)``).

:mod:`.channel` starts and watches the helper, :mod:`.helper` is the helper process (a third
driver of the one core: each job there is the asyncio heartbeat), :mod:`.job` is the owner's
proxy with the public members of a heartbeat. See docs/worker.md ("The sidecar").
"""
