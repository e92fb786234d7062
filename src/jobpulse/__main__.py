"""``python -m jobpulse``: the same as the ``jobpulse`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
