"""The fault proxy adds no fault of its own: what a server does to its connections, the
proxy's clients see."""

from __future__ import annotations

import socket

from jobpulse._provision import RedisServer

from .proxy import FaultProxy


def test_a_server_restart_closes_the_clients_connection_through_the_proxy(
    private_redis: RedisServer,
) -> None:
    # Not a half-open link: a client without a socket timeout (kombu's default) would wait
    # forever for the reply to its next command (issue 26: a Celery node's ack hung).
    with (
        FaultProxy(private_redis.port) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock,
    ):
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        private_redis.restart()
        assert sock.recv(64) == b""  # closed, as the server closed it
