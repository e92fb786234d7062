"""Private servers for parallel test workers: a port taken between picking and binding."""

from __future__ import annotations

import pytest

from jobpulse._provision import RedisServer, free_port


def test_a_server_whose_picked_port_was_taken_moves_to_another_port() -> None:
    """Another worker's server took the port this one picked: it starts on a new port, and
    never takes the other server (which answers PING on that port too) for its own."""
    with RedisServer() as other:
        picks = iter([other.port, free_port()])
        with RedisServer(pick_port=lambda: next(picks)) as server:
            assert server.port != other.port
            assert server.proc is not None
            assert server.proc.poll() is None
        assert other.proc is not None
        assert other.proc.poll() is None  # untouched


def test_a_server_given_a_taken_port_raises() -> None:
    """A port the caller chose (or a restart's) is never replaced: starting fails clearly."""
    with RedisServer() as other:
        server = RedisServer(port=other.port)
        try:
            with pytest.raises(RuntimeError, match=f"did not start on port {other.port}"):
                server.start()
        finally:
            server.close()


def test_a_server_started_again_keeps_its_port_or_raises() -> None:
    """Clients know a server's port: stopped and started again (or restarted), it never moves,
    even when someone took the port meanwhile."""
    with RedisServer() as server:
        port = server.port
        server.restart()
        assert server.port == port
        server.stop()
        with RedisServer(port=port) as thief:
            with pytest.raises(RuntimeError, match=f"did not start on port {port}"):
                server.start()
            assert server.port == port
            assert thief.proc is not None
            assert thief.proc.poll() is None
