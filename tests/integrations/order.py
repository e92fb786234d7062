"""Which of two writes reached Redis first, from what MONITOR showed (tests/support.Monitor)."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.support import Monitor, eventually


def monitor(redis_url: str) -> Monitor:
    """A Monitor of the server ``redis_url`` names."""
    url = urlsplit(redis_url)
    return Monitor(url.port or 6379, url.hostname or "127.0.0.1")


def first_line(mon: Monitor, *parts: str) -> int:
    """The index of the first command MONITOR showed that holds every one of ``parts`` (each a
    quoted argument, as MONITOR prints them), or -1."""
    for index, line in enumerate(list(mon.lines)):
        if all(f'"{part}"' in line for part in parts):
            return index
    return -1


def final_write(mon: Monitor, job_id: str, status: str) -> int:
    """The index of jobpulse's final write of ``job_id`` with ``status`` (the finish script's
    call: its keys name the job, ARGV[5] is the status), or -1."""
    for index, line in enumerate(list(mon.lines)):
        if " lua]" not in line and job_id in line and f'"{status}"' in line:
            return index
    return -1


async def final_write_seen(mon: Monitor, job_id: str, status: str) -> int:
    """:func:`final_write` once MONITOR's stream brought it here: a reader may see the final
    state before this connection has read the line that wrote it."""

    async def seen() -> int | None:
        index = final_write(mon, job_id, status)
        return None if index < 0 else index + 1

    return await eventually(seen, within=5) - 1
