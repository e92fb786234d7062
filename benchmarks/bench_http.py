"""What does the HTTP adapter cost? SSE fan-out and JSON polling through ``jobpulse serve``.

The server is ``jobpulse.http.serve`` (uvicorn, one process, one ``StatusReader``) started as a
subprocess on a free port; the clients are raw asyncio sockets in this process (lighter than
any HTTP library, so the client side is not what is measured).

1. SSE fan-out: N clients (1,000, then 5,000) follow one running job's
   ``/jobs/{id}/events``. A writer on its own Redis connection XADDs entries whose details carry
   ``perf_counter()`` (CLOCK_MONOTONIC: the same clock in every process of the machine); each
   client records its receive time minus that: XADD-to-client latency, p50/p99/max. Also the
   server's RSS per connected client, and whether every client received every entry.
2. JSON polling: C keep-alive connections loop ``GET /jobs/{id}`` for a few seconds, once with
   ``If-None-Match`` carrying the current ETag (304, no body: an ETag hit) and once without
   (200 with the JSON body: a miss). The job's snapshot does not change during the window, and
   the reader's 0.5 s cache answers most reads, so this is the HTTP layer's own cost.

Run: ``python -m benchmarks.bench_http [REDIS_URL] [--quick]`` (without a URL it starts a
private redis-server); prints JSON. ``run(redis_url)`` flushes that server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import redis.asyncio as aioredis

from jobpulse import heartbeat
from jobpulse._protocol.keys import KeySchema

from .common import pct as _pct
from .common import standalone_main

NS = "bench"
NAME = "http"
TITLE = "HTTP adapter: SSE fan-out and JSON polling"
ROOT = Path(__file__).resolve().parents[1]


def _stack() -> str:
    """The event loop and HTTP parser uvicorn picks here (uvicorn[standard] adds faster ones)."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    parser = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} loop, {parser}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(redis_url: str, port: int) -> Any:
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from jobpulse.http.serve import serve; "
         "serve(sys.argv[1], '127.0.0.1', int(sys.argv[2]), 'bench', log_level='warning')",
         redis_url, str(port)],
        cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- a minimal HTTP/1.1 client ----------------------------------------------------------------


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, headers: str = ""
) -> tuple[int, dict[str, str], bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n{headers}\r\n".encode())
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    head: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        head[name.strip().lower()] = value.strip()
    body = b""
    if "content-length" in head:
        body = await reader.readexactly(int(head["content-length"]))
    return status, head, body


class _SSEClient:
    """One SSE connection; records the latency of every entry whose details carry ``sent``.

    Parsing is kept to byte searches (no JSON decode per frame) so that a thousand clients in
    one process do not become the bottleneck being measured.
    """

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ids: list[str] = []
        self.ready = asyncio.Event()

    async def run(self, port: int, path: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                raise RuntimeError(f"SSE answered {head[:40]!r}")
            chunked = b"transfer-encoding: chunked" in head.lower()
            raw = b""  # undecoded bytes (chunk framing)
            body = b""  # decoded SSE text
            while chunk := await reader.read(1 << 16):
                now = time.perf_counter()
                if chunked:
                    raw += chunk
                    while True:
                        eol = raw.find(b"\r\n")
                        if eol < 0:
                            break
                        size = int(raw[:eol], 16)
                        if size == 0:
                            return
                        if len(raw) < eol + 2 + size + 2:
                            break
                        body += raw[eol + 2 : eol + 2 + size]
                        raw = raw[eol + 4 + size :]
                else:
                    body += chunk
                *frames, body = body.split(b"\n\n")
                for frame in frames:
                    self._frame(frame, now)
        finally:
            writer.close()

    def _frame(self, frame: bytes, now: float) -> None:
        if frame.startswith(b":") or frame.startswith(b"retry"):
            self.ready.set()
            return
        if frame.startswith(b"id: "):
            self.ids.append(frame[4 : frame.index(b"\n")].decode())
        at = frame.find(b'"sent":')
        if at >= 0:
            end = frame.index(b"}", at)
            self.latencies.append(now - float(frame[at + 7 : end]))


# -- benchmarks -------------------------------------------------------------------------------


async def bench_sse(
    redis_url: str, port: int, server_pid: int, clients: int, entries: int, spacing: float
) -> dict[str, Any]:
    job = f"sse-{clients}"
    client = aioredis.Redis.from_url(redis_url)
    writer = aioredis.Redis.from_url(redis_url)
    server = psutil.Process(server_pid)
    try:
        async with heartbeat(client, job, namespace=NS, interval=2.0, ttl=20.0) as hb:
            rss_before = server.memory_info().rss
            sse = [_SSEClient() for _ in range(clients)]
            t0 = time.perf_counter()
            tasks = [asyncio.create_task(c.run(port, f"/jobs/{job}/events")) for c in sse]
            await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in sse)), 120)
            await asyncio.sleep(1.0)  # every watcher attached and idle
            connect_s = time.perf_counter() - t0
            rss_after = server.memory_info().rss
            key = KeySchema(NS).events(job)
            sent_ids = []
            cpu0 = server.cpu_times()
            w0 = time.perf_counter()
            for i in range(entries):
                details = orjson.dumps({"sent": time.perf_counter()}).decode()
                eid = await writer.xadd(
                    key, {"kind": "checkpoint", "status": "RUNNING", "seq": 1_000_000 + i,
                          "fence": hb.fence, "details": details},
                )  # fmt: skip
                sent_ids.append(eid.decode())
                await asyncio.sleep(spacing)
            expected = len(sent_ids) * clients
            deadline = time.monotonic() + 60
            while sum(len(c.latencies) for c in sse) < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            window = time.perf_counter() - w0
            cpu1 = server.cpu_times()
        # the heartbeat's end entry closes every stream
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
    finally:
        await client.aclose()
        await writer.aclose()
    latencies = [x for c in sse for x in c.latencies]
    wanted = set(sent_ids)
    complete = sum(1 for c in sse if [i for i in c.ids if i in wanted] == sent_ids)
    return {
        "clients": clients,
        "entries": entries,
        "entry_spacing_ms": spacing * 1000,
        "deliveries": len(latencies),
        "expected_deliveries": expected,
        "clients_with_every_entry": complete,
        "connect_all_s": round(connect_s, 2),
        "server_rss_per_client_kib": round((rss_after - rss_before) / clients / 1024, 1),
        "server_cpu_share_while_sending": round(
            (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / window, 2
        ),
        "frames_per_s": round(len(latencies) / window),
        "p50_ms": round(_pct(latencies, 50) * 1000, 2),
        "p99_ms": round(_pct(latencies, 99) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2) if latencies else None,
    }


async def bench_polling(
    redis_url: str, port: int, connections: int, seconds: float
) -> dict[str, Any]:
    client = aioredis.Redis.from_url(redis_url)
    job = "polled"
    out: dict[str, Any] = {"connections": connections, "seconds": seconds}
    try:
        async with heartbeat(client, job, namespace=NS, interval=30.0, ttl=90.0, total=100) as hb:
            hb.progress.advance(42)
            await hb.checkpoint(n=42)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            _, head, _ = await _request(r, w, f"/jobs/{job}")
            w.close()
            etag = head["etag"]
            for case, extra in (("etag_hit_304", f"If-None-Match: {etag}\r\n"), ("miss_200", "")):
                out[case] = await _poll(port, f"/jobs/{job}", extra, connections, seconds)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            _, head, body = await _request(r, w, f"/jobs/{job}")
            w.close()
            out["json_body_bytes"] = len(body)
    finally:
        await client.aclose()
    return out


async def _poll(
    port: int, path: str, extra: str, connections: int, seconds: float
) -> dict[str, Any]:
    counts: dict[int, int] = {}
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                code, _, _ = await _request(reader, writer, path, extra)
                latencies.append(time.perf_counter() - t)
                counts[code] = counts.get(code, 0) + 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(connections)))
    elapsed = time.perf_counter() - t0
    return {
        "requests_per_s": round(sum(counts.values()) / elapsed),
        "statuses": {str(k): v for k, v in sorted(counts.items())},
        "p50_ms": round(_pct(latencies, 50) * 1000, 2),
        "p99_ms": round(_pct(latencies, 99) * 1000, 2),
    }


async def _run(redis_url: str, quick: bool) -> dict[str, Any]:
    client = aioredis.Redis.from_url(redis_url)
    await client.flushall()
    version = (await client.info("server"))["redis_version"]
    await client.aclose()
    port = _free_port()
    result: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "redis": version,
            "server": f"jobpulse.http.serve: one uvicorn process ({_stack()})",
        }
    }
    with _server(redis_url, port) as proc:
        pid = proc.pid
        # --quick is CI's smoke run: each path once, short windows, no 5,000-stream run.
        result["sse_1000_at_1_per_s"] = await bench_sse(
            redis_url, port, pid, 1000, 3 if quick else 20, 1.0
        )
        result["sse_1000_at_10_per_s"] = await bench_sse(
            redis_url, port, pid, 1000, 10 if quick else 100, 0.1
        )
        if not quick:
            result["sse_5000_at_1_per_s"] = await bench_sse(redis_url, port, pid, 5000, 15, 1.0)
        result["polling"] = await bench_polling(redis_url, port, 32, 1.0 if quick else 5.0)
    return result


def run(redis_url: str, quick: bool = False) -> dict[str, Any]:
    """Run the HTTP benchmarks against ``redis_url`` (a server of the benchmark's own)."""
    return asyncio.run(_run(redis_url, quick))


def main() -> None:
    standalone_main(run)


if __name__ == "__main__":
    main()
