"""BullMQ (Node) as a peer: ``job.updateProgress`` plus ``job.extendLock(token, duration)``.

The Node side is ``benchmarks/node/bullmq_bench.mjs``; its dependency (``bullmq``, pinned in
``benchmarks/node/package.json`` and ``package-lock.json``) is installed into
``benchmarks/node/node_modules`` (git-ignored) with ``npm ci`` on first use, never by the
default install. Without node or npm every caller gets :class:`Unavailable` and reports
"BullMQ: not measured (npm missing)".

Everything is measured server-side only: the harness resets the private server's counters,
tells the Node process what to do over stdin, and reads commandstats / INFO when it answers,
so the figures hold the Node process's own commands and nothing of the harness.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import IO, Any

NODE_DIR = Path(__file__).resolve().parent / "node"
SCRIPT = NODE_DIR / "bullmq_bench.mjs"


def pinned(cpus: set[int] | None) -> list[str]:
    """The command prefix that runs a program on ``cpus`` only (``taskset -c``; empty for any
    CPU). Not ``preexec_fn``: the harness starting these processes has threads."""
    if not cpus:
        return []
    if shutil.which("taskset") is None:
        raise Unavailable("taskset missing")
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))]


class Unavailable(RuntimeError):
    """BullMQ cannot run here (no node/npm, or the install failed); the message says why."""


def ensure_installed() -> None:
    """``npm ci`` into benchmarks/node on first use; raise :class:`Unavailable` if impossible."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise Unavailable("npm missing")
    if (NODE_DIR / "node_modules" / "bullmq" / "package.json").exists():
        return
    cmd = ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    proc = subprocess.run(cmd, cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise Unavailable(f"npm ci failed: {tail}")


def version() -> str | None:
    path = NODE_DIR / "node_modules" / "bullmq" / "package.json"
    if not path.exists():
        return None
    return str(json.loads(path.read_text())["version"])


class NodePeer:
    """One Node process holding ``jobs`` active BullMQ jobs (each with its lock token) on the
    server at ``port``: ``with NodePeer(port, jobs) as peer: peer.ask("both 1000 0")``."""

    def __init__(self, port: int, jobs: int, cpus: set[int] | None = None) -> None:
        """``cpus``: the CPUs the Node process may run on (default: any)."""
        ensure_installed()
        self.proc = subprocess.Popen(
            [*pinned(cpus), "node", str(SCRIPT), str(port), str(jobs)],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._read()  # {"ready": true}, after setup and the warm-up calls

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        while True:
            line = out.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise Unavailable(f"node exited: {err.strip()[-300:]}")
            if line.startswith("{"):
                result: dict[str, Any] = json.loads(line)
                return result

    def ask(self, command: str) -> dict[str, Any]:
        """Send one command line (see bullmq_bench.mjs) and wait for its JSON answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def __enter__(self) -> NodePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
