"""A TCP fault proxy between clients and a private Redis, run in a thread of its own.

Its own event loop means the faults it injects never depend on the (possibly starved) loop of
the code under test. Every fault is a setting a test flips while traffic flows:

* ``latency`` / ``jitter`` (seconds): added before each chunk of replies is forwarded;
* ``blackhole``: connections stay open, no byte is forwarded either way (buffered until lifted);
* ``reset()``: every open connection is aborted (RST), new ones are accepted;
* a connection the server closes (its restart) is closed to the client too, as without the
  proxy (never a half-open link);
* ``read_rate`` (bytes/s): replies trickle to the client (slow reads);
* ``refuse_blocking_reads``: ``XREAD … BLOCK`` is answered with an error, as by a server that
  serves only non-blocking reads (Upstash); every other command passes unchanged. The proxy
  parses the client's commands (RESP arrays) and sends the real server, in the refused command's
  place, an ``EVAL`` that returns that error, so the reply keeps its place in a pipeline.
  ``refused`` counts them.
* ``drop_reply_once(marker)``: the next request holding ``marker`` is forwarded (Redis runs
  it), then the connection is cut before its reply reaches the client (a lost reply: the
  client's retry sends the command again); with ``hold=True`` the proxy also turns into a
  blackhole at that moment, so the retry waits until the test lifts it (something else can
  happen in Redis between the command and its retry);
* ``delay_reply_once(marker, seconds)``: the same request's reply is held ``seconds``.

Given several upstream ports, each new connection goes to the next one in turn (a client
load-balanced over a master and its replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from jobpulse._provision import free_port

__all__ = ["FaultProxy"]


@dataclass
class _Rule:
    marker: bytes
    delay: float | None  # None: drop the reply (cut the connection)
    hold: bool = False  # with a dropped reply: blackhole from then on
    fired: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Conn:
    pending: _Rule | None = None


class FaultProxy:
    def __init__(self, upstream_port: int | list[int], host: str = "127.0.0.1") -> None:
        ports = upstream_port if isinstance(upstream_port, list) else [upstream_port]
        self.upstreams = [(host, p) for p in ports]  # a new connection takes the next in turn
        self.port = free_port()
        self.latency = 0.0
        self.jitter = 0.0
        self.read_rate: float | None = None
        self._blackhole = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._rules: list[_Rule] = []
        self._rules_lock = threading.Lock()
        self.connections = 0
        self.refuse_blocking_reads = False
        self.refused = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def blackhole(self) -> bool:
        return self._blackhole.is_set()

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        if on:
            self._blackhole.set()
        else:
            self._blackhole.clear()

    def drop_reply_once(self, marker: bytes, *, hold: bool = False) -> threading.Event:
        """Forward the next request holding ``marker``, then cut its connection before the
        reply (``hold``: and turn blackhole on, until ``blackhole = False``). Returns an event
        set once that happened."""
        return self._arm(_Rule(marker, None, hold))

    def delay_reply_once(self, marker: bytes, seconds: float) -> threading.Event:
        """Hold the reply to the next request holding ``marker`` for ``seconds``."""
        return self._arm(_Rule(marker, seconds))

    def _arm(self, rule: _Rule) -> threading.Event:
        with self._rules_lock:
            self._rules.append(rule)
        return rule.fired

    def _match(self, data: bytes) -> _Rule | None:
        with self._rules_lock:
            for rule in self._rules:
                if rule.marker in data:
                    self._rules.remove(rule)
                    return rule
        return None

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call_coro(self._start()).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    def reset(self) -> None:
        """Abort every open connection (the client sees a connection reset)."""

        def abort() -> None:
            for w in list(self._writers):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        linger_zero = b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
                w.transport.abort()
            self._writers.clear()

        self._call(abort)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            # End the connection handlers before the loop stops (no "Task was destroyed", no
            # unclosed socket): again while a handler accepted just now is still starting.
            while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                await asyncio.sleep(0)  # a handler that has not started yet registers its socket
                for w in list(self._writers):
                    w.transport.abort()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for w in list(self._writers):
                w.transport.abort()
            # abort() closes each socket in a callback of the next iteration: let it run
            # before the loop stops, or the sockets are left to the garbage collector.
            for _ in range(2):
                await asyncio.sleep(0)

        with contextlib.suppress(Exception):
            self._call_coro(stop()).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _call(self, fn: object) -> None:
        self._loop.call_soon_threadsafe(fn)  # type: ignore[arg-type]

    def _call_coro(self, coro: object) -> Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        upstream = self.upstreams[self.connections % len(self.upstreams)]
        self.connections += 1
        self._writers.add(c_writer)  # aborted by close() even while we connect upstream
        try:
            u_reader, u_writer = await asyncio.open_connection(*upstream)
        except BaseException:  # OSError, or close() cancelling us: never leak the socket
            self._writers.discard(c_writer)
            c_writer.transport.abort()
            if isinstance(sys.exc_info()[1], OSError):
                return
            raise
        self._writers |= {c_writer, u_writer}
        conn = _Conn()
        pipes = [
            asyncio.ensure_future(self._pipe(c_reader, u_writer, to_client=False, conn=conn)),
            asyncio.ensure_future(self._pipe(u_reader, c_writer, to_client=True, conn=conn)),
        ]
        try:
            # Either side closing closes the other, as on a direct connection: a server that
            # stops (a restart) closes its clients' connections. Waiting for both would leave
            # the client a half-open link, where a client without a socket timeout (kombu's
            # default) waits forever for the reply to its next command.
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (c_writer, u_writer):
                self._writers.discard(w)
                w.transport.abort()
            for p in pipes:
                p.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_client: bool,
        conn: _Conn,
    ) -> None:
        pending = b""  # commands not complete yet (only when rewriting)
        while data := await reader.read(65536):
            if not to_client and (self.refuse_blocking_reads or pending):
                data, pending = self._rewrite(pending + data)
            while self._blackhole.is_set():  # hold the bytes until the hole is lifted
                await asyncio.sleep(0.01)
            if not to_client and conn.pending is None:
                conn.pending = self._match(data)
            elif to_client and conn.pending is not None:
                rule, conn.pending = conn.pending, None
                if rule.delay is None:  # the command ran; its reply is lost with the link
                    if rule.hold:
                        self._blackhole.set()
                    rule.fired.set()
                    raise ConnectionResetError("fault proxy: reply dropped")
                await asyncio.sleep(rule.delay)
                rule.fired.set()
            delay = self.latency + (random.uniform(0, self.jitter) if self.jitter else 0.0)
            if delay and to_client:
                await asyncio.sleep(delay)
            if to_client and self.read_rate:
                for i in range(0, len(data), 256):
                    writer.write(data[i : i + 256])
                    await writer.drain()
                    await asyncio.sleep(256 / self.read_rate)
            else:
                writer.write(data)
                await writer.drain()

    # -- refusing blocking reads ----------------------------------------------------------

    REFUSAL = b"ERR blocking reads are not supported by this server"

    def _rewrite(self, buf: bytes) -> tuple[bytes, bytes]:
        """Forwardable bytes of ``buf`` (each XREAD with BLOCK replaced) and the incomplete rest."""
        out = bytearray()
        pos = 0
        while pos < len(buf):
            parsed = _parse_command(buf, pos)
            if parsed is None:
                break
            args, end = parsed
            if self.refuse_blocking_reads and _is_blocking_xread(args):
                self.refused += 1
                out += _command([b"EVAL", b"return redis.error_reply(ARGV[1])", b"0", self.REFUSAL])
            else:
                out += buf[pos:end]
            pos = end
        return bytes(out), buf[pos:]


def _parse_command(buf: bytes, pos: int) -> tuple[list[bytes], int] | None:
    """One RESP array of bulk strings at ``pos`` (what clients send): its arguments and end, or
    None when it is not complete yet."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    if buf[pos : pos + 1] != b"*":  # an inline command: pass it as one "argument"
        return [buf[pos:line_end]], line_end + 2
    count = int(buf[pos + 1 : line_end])
    pos = line_end + 2
    args: list[bytes] = []
    for _ in range(count):
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(buf[pos + 1 : line_end])
        start = line_end + 2
        if len(buf) < start + size + 2:
            return None
        args.append(buf[start : start + size])
        pos = start + size + 2
    return args, pos


def _is_blocking_xread(args: list[bytes]) -> bool:
    if not args or args[0].upper() not in (b"XREAD", b"XREADGROUP"):
        return False
    upper = [a.upper() for a in args]
    streams = upper.index(b"STREAMS") if b"STREAMS" in upper else len(upper)
    return b"BLOCK" in upper[1:streams]


def _command(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
