"""jobpulse: make the effort of long-running jobs legible in Redis, in real time.

The public API is exactly what this module re-exports; every other module is private.
"""

from . import sync as sync
from ._protocol.clock import ScriptClock as ScriptClock
from ._protocol.clock import script_time as script_time
from ._reader.backoff import Backoff as Backoff
from ._reader.cache import CacheStatistics as CacheStatistics
from ._reader.event import Event as Event
from ._reader.hubtypes import HubStatistics as HubStatistics
from ._reader.reader import ReaderStatistics as ReaderStatistics
from ._reader.reader import StatusReader as StatusReader
from ._reader.status import JobState as JobState
from ._reader.status import JobStatus as JobStatus
from ._recovery.control import request_cancel as request_cancel
from ._recovery.sweeper import OnStale as OnStale
from ._recovery.sweeper import StaleJob as StaleJob
from ._recovery.sweeper import Sweeper as Sweeper
from ._recovery.sweeper import SweeperStatistics as SweeperStatistics
from ._worker.current import current as current
from ._worker.heartbeat import HeartbeatStatistics as HeartbeatStatistics
from ._worker.heartbeat import JobHeartbeat as JobHeartbeat
from ._worker.heartbeat import heartbeat as heartbeat
from ._worker.progress import ProgressCell as ProgressCell
from ._worker.sidecar.job import AsyncSidecarHeartbeat as AsyncSidecarHeartbeat
from .errors import InvalidJobId as InvalidJobId
from .errors import JobBusy as JobBusy
from .errors import JobCancelled as JobCancelled
from .errors import JobpulseError as JobpulseError
from .errors import LeaseLost as LeaseLost
from .errors import LeaseLostCause as LeaseLostCause
from .errors import ProtocolError as ProtocolError
from .errors import StateNotWritten as StateNotWritten

__version__ = "0.1.0"

__all__ = (
    "AsyncSidecarHeartbeat",
    "Backoff",
    "CacheStatistics",
    "Event",
    "HeartbeatStatistics",
    "HubStatistics",
    "InvalidJobId",
    "JobBusy",
    "JobCancelled",
    "JobHeartbeat",
    "JobState",
    "JobStatus",
    "JobpulseError",
    "LeaseLost",
    "LeaseLostCause",
    "OnStale",
    "ProgressCell",
    "ProtocolError",
    "ReaderStatistics",
    "ScriptClock",
    "StaleJob",
    "StateNotWritten",
    "StatusReader",
    "Sweeper",
    "SweeperStatistics",
    "current",
    "heartbeat",
    "request_cancel",
    "script_time",
    "sync",
)
