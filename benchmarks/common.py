"""What every benchmark shares: a private Redis, clean server counters, client-side command
counting, the machine's description and small statistics helpers.

Server counters come from ``INFO stats commandstats`` after ``CONFIG RESETSTAT``, read through
a raw socket (:class:`Probe`) so the harness never shows up in the client-side counts; its own
few bytes are measured once (:meth:`Probe.calibrate`) and subtracted.

Client-side counts come from :class:`SentCounter`, which wraps redis-py's
``send_packed_command`` (sync and asyncio): every call is one write, i.e. one round trip, and
the RESP it carries names the top-level commands. So "commands per update" never includes the
calls a Lua script makes inside Redis, which ``INFO commandstats`` also counts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, ClassVar

from jobpulse._provision import RedisServer

__all__ = [
    "Probe",
    "SentCounter",
    "UpdateCost",
    "machine_info",
    "pct",
    "private_redis",
    "ratio",
]


# -- a private server -----------------------------------------------------------------------


@contextlib.contextmanager
def private_redis(args: list[str] | None = None) -> Iterator[RedisServer]:
    """A ``redis-server`` of this benchmark's own (clean counters, nobody else's traffic)."""
    with RedisServer(args=args) as server:
        yield server


# -- a raw RESP probe for INFO and CONFIG RESETSTAT -----------------------------------------


class Probe:
    """A minimal RESP2 client on its own socket, for the harness's INFO and RESETSTAT."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")
        self.overhead_in = 0
        self.overhead_out = 0

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def call(self, *args: str | bytes | int) -> Any:
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(parts))
        return self._read()

    def _read(self) -> Any:
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")

    def reset(self) -> None:
        self.call("CONFIG", "RESETSTAT")

    def info(self, *sections: str) -> dict[str, str]:
        text = self.call("INFO", *sections).decode()
        out: dict[str, str] = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, _, v = line.partition(":")
                out[k] = v
        return out

    def calibrate(self) -> None:
        """Measure the bytes our own RESETSTAT + INFO add to the server's net counters."""
        samples_in, samples_out = [], []
        for _ in range(3):
            self.reset()
            s = self.snapshot()
            samples_in.append(s["net_in"])
            samples_out.append(s["net_out"])
        self.overhead_in, self.overhead_out = min(samples_in), min(samples_out)

    def snapshot(self) -> dict[str, Any]:
        """Commandstats (``{name: (calls, usec)}``) and net bytes since the last reset."""
        info = self.info("stats", "commandstats")
        cmds: dict[str, tuple[int, int]] = {}
        for k, v in info.items():
            if k.startswith("cmdstat_"):
                f = dict(x.split("=", 1) for x in v.split(","))
                cmds[k.removeprefix("cmdstat_")] = (int(f["calls"]), int(f["usec"]))
        return {
            "cmds": cmds,
            "net_in": int(info["total_net_input_bytes"]) - self.overhead_in,
            "net_out": int(info["total_net_output_bytes"]) - self.overhead_out,
        }

    def redis_version(self) -> str:
        return self.info("server")["redis_version"]


# -- client-side command counting -----------------------------------------------------------


def _names(packed: Any) -> tuple[list[str], int]:
    """Top-level command names (lower case, ``cmd|sub`` for container commands) in a packed
    RESP write, and its size."""
    if isinstance(packed, str):
        data = packed.encode()
    elif isinstance(packed, bytes | bytearray | memoryview):
        data = bytes(packed)
    else:
        data = b"".join(bytes(p) for p in packed)
    names, i = [], 0
    while i < len(data) and data[i : i + 1] == b"*":
        end = data.index(b"\r\n", i)
        n = int(data[i + 1 : end])
        i = end + 2
        args = []
        for _ in range(n):
            end = data.index(b"\r\n", i)
            ln = int(data[i + 1 : end])
            i = end + 2
            if len(args) < 2:
                args.append(data[i : i + ln].decode(errors="replace").lower())
            i += ln + 2
        name = args[0] if args else "?"
        if name in ("client", "config", "script", "object", "xinfo", "memory") and len(args) > 1:
            name = f"{name}|{args[1]}"
        names.append(name)
    return names, len(data)


class SentCounter:
    """Counts what redis-py clients of this process send: writes, top-level commands, bytes."""

    _installed = False
    enabled = False
    writes = 0
    bytes_sent = 0
    commands: ClassVar[Counter[str]] = Counter()

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        import redis.asyncio.connection as aconn
        import redis.connection as sconn

        sync_send = sconn.AbstractConnection.send_packed_command
        async_send = aconn.AbstractConnection.send_packed_command

        def counted_sync(self: Any, command: Any, check_health: bool = True) -> None:
            if cls.enabled:
                cls._count(command)
            return sync_send(self, command, check_health)

        async def counted_async(self: Any, command: Any, check_health: bool = True) -> None:
            if cls.enabled:
                cls._count(command)
            return await async_send(self, command, check_health)

        sconn.AbstractConnection.send_packed_command = counted_sync  # type: ignore[method-assign]
        aconn.AbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign]
        cls._installed = True

    @classmethod
    def _count(cls, command: Any) -> None:
        names, size = _names(command)
        if not names:
            return
        cls.writes += 1
        cls.bytes_sent += size
        cls.commands.update(names)

    @classmethod
    def start(cls) -> None:
        cls.install()
        cls.writes = cls.bytes_sent = 0
        cls.commands.clear()
        cls.enabled = True

    @classmethod
    def stop(cls) -> dict[str, Any]:
        cls.enabled = False
        return {"writes": cls.writes, "bytes": cls.bytes_sent, "commands": dict(cls.commands)}


class UpdateCost:
    """Per-update cost over one window: ``with UpdateCost(probe) as cost: ...; cost.per(n)``."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.client: dict[str, Any] = {}
        self.server: dict[str, Any] = {}

    def __enter__(self) -> UpdateCost:
        self.probe.reset()
        SentCounter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client = SentCounter.stop()
        self.server = self.probe.snapshot()

    def per(self, updates: int) -> dict[str, Any]:
        """Figures per update. Server µs counts each top-level command's own time (a script's
        includes the calls it makes); a name the scripts also call inside Redis is prorated to
        the calls the client sent."""
        n = max(updates, 1)
        sent: dict[str, int] = self.client["commands"]
        cmds: dict[str, tuple[int, int]] = self.server["cmds"]
        usec = 0.0
        breakdown: dict[str, float] = {}
        for name, count in sent.items():
            calls, us = cmds.get(name, (0, 0))
            if calls:
                share = min(1.0, count / calls)
                usec += us * share
                breakdown[name] = us * share / count
        inner = sum(c for c, _ in cmds.values()) - sum(sent.values())
        return {
            "updates": updates,
            "round_trips": self.client["writes"] / n,
            "commands": sum(sent.values()) / n,
            "command_mix": {k: round(v / n, 3) for k, v in sorted(sent.items())},
            "usec_per_call": {k: round(v, 2) for k, v in sorted(breakdown.items())},
            "inner_calls": max(inner, 0) / n,
            "server_us": usec / n,
            "bytes_in": self.server["net_in"] / n,
            "bytes_out": self.server["net_out"] / n,
            "bytes_sent_client": self.client["bytes"] / n,
            "server_cmds": {k: v[0] for k, v in sorted(cmds.items())},
        }


# -- the machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info(redis_version: str) -> dict[str, Any]:
    """CPU model, cores, Python, Redis and library versions, date and load at the start."""
    redis_server = ""
    with contextlib.suppress(Exception):
        redis_server = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "redis_version": redis_version,
        "redis_server": redis_server,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "packages": {
            name: _version(name)
            for name in ("jobpulse", "redis", "hiredis", "saq", "rq", "celery", "kombu")
        },
    }


# -- statistics -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return float(time.perf_counter_ns() - t0)


def standalone_main(run: Callable[[str, bool], Any]) -> None:
    """``python -m benchmarks.bench_x [REDIS_URL] [--quick]``: run one benchmark on its own,
    against the given Redis or a private ``redis-server``, and print its JSON."""
    import json

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    if args:
        result = run(args[0], quick)
    else:
        with private_redis() as server:
            result = run(server.url, quick)
    print(json.dumps(result, indent=2, default=str))


async def advancer(cells: list[Any], period: float, stop: Any) -> None:
    """Move every job's progress between beats, as running computations would (one task for
    all jobs), until the ``asyncio.Event`` ``stop`` is set."""
    import asyncio

    while not stop.is_set():
        for c in cells:
            c.advance()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(period):
                await stop.wait()
