"""HTTP adapter (the ``jobpulse[http]`` extra): an ASGI app over a :class:`~jobpulse.StatusReader`.

``create_app(reader)`` answers job status as JSON (with ``ETag``, 304, ``Retry-After``,
``Cache-Control`` and a long poll, ``?wait=``), job events as Server-Sent Events (resumable with
``Last-Event-ID``), the list of running and stale jobs, and a live dashboard. ``serve()`` runs it
with uvicorn (``jobpulse serve``). ``accepted()`` is the ``202 Accepted`` a route returns after
starting a job; ``poll()`` waits on a job through its status URL from another service.
"""

from .accept import accepted as accepted
from .app import Authorize as Authorize
from .app import HttpConfig as HttpConfig
from .app import create_app as create_app
from .poll import PollError as PollError
from .poll import poll as poll
from .serve import serve as serve

__all__ = ("Authorize", "HttpConfig", "PollError", "accepted", "create_app", "poll", "serve")
