"""HTTP adapter (the ``jobpulse[http]`` extra): an ASGI app over a :class:`~jobpulse.StatusReader`.

``create_app(reader)`` answers job status as JSON (with ``ETag`` and 304), job events as
Server-Sent Events (resumable with ``Last-Event-ID``), the list of running and stale jobs, and a
live dashboard. ``serve()`` runs it with uvicorn (``jobpulse serve``).
"""

from .app import Authorize as Authorize
from .app import HttpConfig as HttpConfig
from .app import create_app as create_app
from .serve import serve as serve

__all__ = ("Authorize", "HttpConfig", "create_app", "serve")
