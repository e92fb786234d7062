"""Our RESP packing (``_protocol/wire.py``, ``plan.pack_beats``) writes the bytes redis-py's own
packer writes for the same command: the tickers' and the reader's packed writes are the
commands their pipelines would send."""

from __future__ import annotations

from typing import Any

import pytest
from redis.connection import Connection

from jobpulse._protocol import calls, wire
from jobpulse._protocol.clock import ScriptClock
from jobpulse._worker.plan import pack_beats


def _redis_py(*args: Any) -> bytes:
    return b"".join(Connection().pack_command(*args))


@pytest.mark.parametrize(
    "args",
    [
        ("PTTL", "k"),
        ("EVALSHA", "ab" * 20, 2, b"k1", b"k2", 0, -7, 1.5, "é", b"", ""),
        ("HSET", "k", "f", 12345678901234567890, "g", 0.1),
    ],
)
def test_pack_writes_what_redis_py_writes(args: tuple[Any, ...]) -> None:
    assert wire.pack(args) == _redis_py(*args)


def test_pack_refuses_what_it_cannot_send() -> None:
    with pytest.raises(TypeError, match="cannot send NoneType None"):
        wire.pack(["SET", "k", None])


def test_pack_beats_is_the_pipeline_of_the_beat_calls_and_index_zadds() -> None:
    segment = calls.beat_segment(token="t", fence=3, ttl_ms=30000, seq=9, fields={"done": 4})
    command = calls.beat_command([((b"a", b"b", b"c", b"d", b"e"), segment)])
    index = {"ns:running": {"j1": 1700, "j2": 1800}, "ns:kinds": {"kind": 1900}}
    packed = pack_beats([([], command)], index, ScriptClock())
    expected = _redis_py(*command)
    expected += _redis_py("ZADD", "ns:running", "GT", 1700, "j1", 1800, "j2")
    expected += _redis_py("ZADD", "ns:kinds", "GT", 1900, "kind")
    assert packed == expected
