"""Queue integrations: run every task of a job queue under a jobpulse heartbeat.

One module per queue, each imported on its own so ``import jobpulse`` never needs a queue:
``jobpulse.integrations.arq``, ``.saq``, ``.taskiq`` (asyncio queues). Each comes in an extra of
the same name (``pip install "jobpulse[arq]"``). What they share (id mapping, options, keeping
the queue's claim fresh) lives in ``jobpulse.integrations._common``.
"""

from ._common import PulseOptions as PulseOptions
from ._common import job_id_for as job_id_for
from ._common import kind_for as kind_for

__all__ = ("PulseOptions", "job_id_for", "kind_for")
