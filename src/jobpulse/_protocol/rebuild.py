"""Rebuild a Redis client in another process: the sidecar helper's client.

A live client cannot cross a process boundary (sockets, locks, a pool), so the sidecar helper
(:mod:`jobpulse._worker.sidecar`) builds its own from a picklable zero-argument factory that
returns an asyncio client. :func:`factory_of` derives one from a plain ``redis.Redis`` or
``redis.asyncio.Redis`` (TCP, TLS or a Unix socket, with its ACL username and password): the
connection settings are copied, nothing else (a custom ``retry`` policy, ``credential_provider``
or connect callback is not: pass a factory of your own). For any other client (Sentinel,
Cluster) it raises, naming the problem, before anything is written to Redis.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

from .clients import AsyncClient
from .clock import ClockMode, known_clock, script_time

__all__ = ["ClientFactory", "HelperClient", "RedisFactory", "checked_factory", "factory_of"]

ClientFactory = Callable[[], AsyncClient]
"""A picklable callable of no arguments returning a ``redis.asyncio.Redis`` or
``redis.asyncio.RedisCluster``: how the sidecar helper builds its client."""

_PLAIN = [
    "db", "username", "password", "socket_timeout", "socket_connect_timeout", "socket_keepalive",
    "socket_read_size", "encoding", "encoding_errors", "decode_responses",
    "health_check_interval", "client_name", "protocol", "host", "port", "path",
]  # fmt: skip
_SSL = [
    "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_include_verify_flags",
    "ssl_exclude_verify_flags", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
    "ssl_check_hostname", "ssl_min_version", "ssl_ciphers", "ssl_password",
]  # fmt: skip
_CLASSES: dict[str, type[Any]] = {
    "tcp": redis.asyncio.connection.Connection,
    "ssl": redis.asyncio.connection.SSLConnection,
    "unix": redis.asyncio.connection.UnixDomainSocketConnection,
}
_KINDS: dict[type[Any], str] = {
    redis.connection.Connection: "tcp",
    redis.connection.SSLConnection: "ssl",
    redis.connection.UnixDomainSocketConnection: "unix",
    redis.asyncio.connection.Connection: "tcp",
    redis.asyncio.connection.SSLConnection: "ssl",
    redis.asyncio.connection.UnixDomainSocketConnection: "unix",
}


@dataclass(frozen=True, slots=True)
class RedisFactory:
    """Builds a ``redis.asyncio.Redis`` with the connection settings of another client.

    Attributes:
        kind: ``"tcp"``, ``"ssl"`` or ``"unix"``.
        settings: the connection keyword arguments (host, port, db, username, password, TLS
            files and options, timeouts).
    """

    kind: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> AsyncClient:
        pool = redis.asyncio.ConnectionPool(connection_class=_CLASSES[self.kind], **self.settings)
        return redis.asyncio.Redis.from_pool(pool)  # its aclose() closes the pool too

    def __repr__(self) -> str:  # never show the password
        shown = {k: v for k, v in self.settings.items() if k not in ("password", "ssl_password")}
        return f"RedisFactory(kind={self.kind!r}, settings={shown!r})"


def factory_of(client: Any) -> RedisFactory:
    """A factory that rebuilds ``client`` (a plain ``redis.Redis`` or ``redis.asyncio.Redis``).

    Raises:
        TypeError: the client cannot be rebuilt from its settings (Sentinel, Cluster, a custom
            connection class, a ``credential_provider`` or connect callback): pass
            ``client_factory=`` instead.
    """
    pool = getattr(client, "connection_pool", None)
    plain = isinstance(client, redis.Redis | redis.asyncio.Redis) and type(pool) in (
        redis.ConnectionPool,
        redis.BlockingConnectionPool,
        redis.asyncio.ConnectionPool,
        redis.asyncio.BlockingConnectionPool,
    )
    kind = _KINDS.get(getattr(pool, "connection_class", None) or type(None)) if plain else None
    if pool is None or kind is None:
        raise TypeError(
            f"sidecar=True: jobpulse cannot rebuild a {type(client).__name__} "
            f"({type(pool).__name__}) in its helper process from its settings; pass "
            "client_factory= (a picklable function of no arguments, importable by module path, "
            "returning a redis.asyncio client for the same server)"
        )
    given = pool.connection_kwargs
    for name in ("credential_provider", "redis_connect_func"):
        if given.get(name) is not None:
            raise TypeError(
                f"sidecar=True: the client has a {name}, which jobpulse cannot copy into its "
                "helper process; pass client_factory= (a picklable function of no arguments "
                "returning a redis.asyncio client)"
            )
    names = _PLAIN + (_SSL if kind == "ssl" else [])
    settings = {k: given[k] for k in names if k in given and given[k] is not None}
    return RedisFactory(kind, settings)


@dataclass(frozen=True, slots=True)
class HelperClient:
    """What the helper calls to build its client: the factory, then the owner client's script
    time choice (:func:`jobpulse.script_time`), if one was made, applied to the new client."""

    factory: ClientFactory
    clock: tuple[ClockMode, str | None] | None

    def __call__(self) -> AsyncClient:
        client = self.factory()
        if self.clock is not None:
            script_time(client, mode=self.clock[0], time_command=self.clock[1])
        return client


def checked_factory(factory: ClientFactory | None, client: Any) -> bytes:
    """The pickled :class:`HelperClient` the helper will call (``factory``, else
    :func:`factory_of`; with ``client``'s script time choice).

    Raises:
        TypeError: no factory can be derived, or ``factory`` cannot be pickled.
        ValueError: ``factory`` is defined in ``__main__`` (the helper does not run the
            caller's main module, so it could not find it).
    """
    if factory is None:
        factory = factory_of(client)
    elif not callable(factory):
        raise TypeError(f"client_factory must be callable, got {type(factory).__name__}")
    module = getattr(factory, "__module__", None) or getattr(
        getattr(factory, "func", None), "__module__", None
    )
    if module == "__main__":
        raise ValueError(
            "client_factory is defined in __main__: the sidecar helper process does not run "
            "your main module, so it cannot load it; define it in an importable module"
        )
    chosen = known_clock(client)
    clock = None if chosen is None else (chosen.mode, chosen.time_command)
    try:
        return pickle.dumps(HelperClient(factory, clock))
    except Exception as exc:
        raise TypeError(
            f"client_factory must be picklable (a module-level function, functools.partial "
            f"of one, or an instance of a module-level class): {exc!r}"
        ) from exc
