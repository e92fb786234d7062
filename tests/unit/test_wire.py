"""Our RESP packing (``_protocol/wire.py``, ``plan.pack_beats``) writes the bytes redis-py's own
packer writes for the same command: the tickers' and the reader's packed writes are the
commands their pipelines would send. ``wire.pack`` is hiredis's packer where hiredis is
installed and ``wire.pack_python`` otherwise: both write the same bytes as redis-py's Python
packer on every argument shape jobpulse sends (the path without hiredis, end to end, is
``tests/integration/test_no_hiredis.py``)."""

from __future__ import annotations

import re
from typing import Any

import hiredis
import pytest
from redis.connection import Connection, Encoder, PythonRespSerializer

from jobpulse._protocol import calls, wire
from jobpulse._protocol.calls import AcquireCode, AcquireReply
from jobpulse._protocol.clock import ScriptClock
from jobpulse._worker.machine import BeatMachine
from jobpulse._worker.options import HeartbeatSpec
from jobpulse._worker.plan import beat_calls, pack_beats
from jobpulse._worker.sampling import ProcessSample

SAMPLE = ProcessSample(rss_bytes=1000, cpu_seconds=0.5)


class _Job:
    def __init__(self, job_id: str, **options: Any) -> None:
        settings: dict[str, Any] = dict(
            total=None, interval=1.0, ttl=6.0, namespace="t", meta=None, kind="k",
            worker="w", stream_every=10, maxlen=1000, retention=3600.0,
            max_meta_bytes=65536, max_details_bytes=65536, final_timeout=30.0,
            index_every=10, index_shards=1,
        )  # fmt: skip
        settings.update(options)
        self.machine: BeatMachine[str] = BeatMachine(job_id, HeartbeatSpec(**settings))
        self.machine.acquired(AcquireReply(AcquireCode.STARTED, 3, 1, 0, "", 1000), sent_at=100.0)


def _redis_py(*args: Any) -> bytes:
    return b"".join(Connection().pack_command(*args))


def _redis_py_python(*args: Any) -> bytes:
    """redis-py's own Python packer (the one it uses without hiredis)."""
    encoder = Encoder(encoding="utf-8", encoding_errors="strict", decode_responses=False)
    return b"".join(PythonRespSerializer(6000, encoder.encode).pack(*args))


SHAPES: list[tuple[Any, ...]] = [
    ("PTTL", "k"),
    ("TIME",),
    ("EVALSHA", "ab" * 20, 2, b"k1", b"k2", 0, -7, 1.5, "é", b"", ""),
    ("HSET", "k", "f", 12345678901234567890, "g", 0.1),
    ("SET", "ключ", "值", "😀", "a\r\nb", b"\x00\xff\r\n", b"\xc3\xa9"),
    ("X", 0, -1, 2**63 - 1, -(2**63), 2**100, -(2**100)),
    ("X", 0.0, -0.0, 1e-7, 1e16, 1e300, -2.5e-300, 1 / 3, float("inf"), float("-inf")),
    ("X", "", b"", "a" * 10_000, b"b" * 100_000),  # past redis-py's buffer cutoff
    ("ZADD", "ns:running", "GT", 1700, "j1", 1800, "j2"),
    tuple(["EVALSHA", "f" * 40, 5] + [f"ns:{{j{i}}}:k" for i in range(5)] + list(range(11))),
    ("RPUSH", "k", *range(1000)),
]


@pytest.mark.parametrize("args", SHAPES, ids=range(len(SHAPES)))
def test_pack_writes_what_redis_py_writes(args: tuple[Any, ...]) -> None:
    """hiredis's packer, ours in Python and redis-py's in Python: the same bytes."""
    expected = _redis_py_python(*args)
    assert hiredis.pack_command(args) == expected
    assert wire.pack_python(args) == expected
    assert wire.pack_python(list(args)) == expected
    assert wire.pack(args) == expected
    assert wire.pack(list(args)) == expected  # the callers pass lists too
    assert _redis_py(*args) == expected


def test_pack_is_hiredis_where_installed() -> None:
    assert wire.HIREDIS_PACK
    assert wire.pack is not wire.pack_python


@pytest.mark.parametrize("pack", [wire.pack, wire.pack_python], ids=["pack", "pack_python"])
@pytest.mark.parametrize(
    ("value", "name"), [(None, "NoneType None"), (True, "bool True"), ([1], "list [1]")]
)
def test_pack_refuses_what_it_cannot_send(pack: Any, value: Any, name: str) -> None:
    """Either packer names the argument it cannot send (hiredis's own error does not)."""
    with pytest.raises(TypeError, match=f"cannot send {re.escape(name)} to Redis"):
        pack(["SET", "k", value])


def test_pack_beats_is_the_pipeline_of_the_beat_calls_and_index_zadds() -> None:
    segment = calls.beat_segment(token="t", fence=3, ttl_ms=30000, seq=9, fields={"done": 4})
    command = calls.beat_command([((b"a", b"b", b"c", b"d", b"e"), segment)])
    index = {"ns:running": {"j1": 1700, "j2": 1800}, "ns:kinds": {"kind": 1900}}
    packed = pack_beats([([], command)], index, ScriptClock())
    expected = _redis_py(*command)
    expected += _redis_py("ZADD", "ns:running", "GT", 1700, "j1", 1800, "j2")
    expected += _redis_py("ZADD", "ns:kinds", "GT", 1900, "kind")
    assert packed == expected


@pytest.mark.parametrize("mode", ["server", "argument"])
def test_pack_beats_with_each_jobs_prepacked_keys_and_head(mode: Any) -> None:
    """Real machines' segments (a first beat: every field; one with a stream entry), in
    batches of ``beat_calls``, under either clock: redis-py's bytes."""
    jobs = [_Job(f"j{i}", stream_every=1 + i % 2) for i in range(70)]
    beats = [(job, job.machine.next_beat(101.0, 0.0, SAMPLE, 5, 9)) for job in jobs]
    batches = beat_calls(beats, None)  # type: ignore[type-var]
    # A fixed clock: the argument time is read once by pack_beats and once by the stamps below
    # (a real clock may tick between them).
    clock = ScriptClock(mode=mode, wall=lambda: 1_700_000_000.123, monotonic=lambda: 5.0)
    packed = pack_beats(batches, {}, clock)  # type: ignore[arg-type]
    stamped = [clock.stamp(command) for _, command in batches]
    assert mode == "server" or stamped[0][1] != calls.SCRIPTS.beat.sha
    assert packed == b"".join(_redis_py(*command) for command in stamped)
