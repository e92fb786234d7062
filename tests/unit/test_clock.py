"""ScriptClock: where a script's time comes from, decided without Redis."""

from __future__ import annotations

import pytest
from redis.exceptions import NoScriptError, ResponseError

from jobpulse._protocol.clock import DRIFT, RESAMPLE, ScriptClock, refuses_time
from jobpulse._protocol.scripts import SCRIPTS
from jobpulse._worker.plan import settle_beats

REFUSED = ResponseError("Unknown Redis command called from script script: 1f0e, on @user_script:9.")


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def beat_command() -> list[object]:
    return ["EVALSHA", SCRIPTS.beat.sha, 4, "s", "e", "a", "f", "tok", 3, 6000, 12]


def test_server_time_sends_every_command_as_it_is() -> None:
    clock = ScriptClock()
    command = beat_command()
    assert clock.stamp(command) is command
    assert clock.script(SCRIPTS.beat) is SCRIPTS.beat
    assert clock.bound == 0.0
    assert not clock.due()


def test_a_time_refusal_switches_auto_to_argument_time_and_nothing_else_does() -> None:
    clock = ScriptClock()
    assert not clock.refused(NoScriptError("No matching script."))
    assert not clock.arguments
    assert clock.refused(REFUSED)
    assert clock.arguments


def test_server_mode_never_switches() -> None:
    clock = ScriptClock(mode="server")
    assert not clock.refused(REFUSED)
    assert not clock.arguments


def test_argument_time_sends_the_variant_with_the_estimated_server_time_last() -> None:
    mono = Clock(100.0)
    clock = ScriptClock(mode="argument", monotonic=mono)
    assert clock.due()
    clock.sampled([b"5000", b"250000"], sent=100.0, received=100.004)  # 4 ms round trip
    mono.now = 101.002
    stamped = clock.stamp(beat_command())
    assert SCRIPTS.beat.argument is not None
    assert stamped[1] == SCRIPTS.beat.argument.sha
    assert list(stamped[2:-1]) == beat_command()[2:]
    assert stamped[-1] == 5001250  # 5000.25 s at 100.002, one second later
    bound = clock.bound
    assert bound == pytest.approx(0.002 + DRIFT * 0.998)
    assert not clock.due()
    mono.now = 100.004 + RESAMPLE
    assert clock.due()


def test_argument_time_leaves_scripts_that_read_no_time_alone() -> None:
    clock = ScriptClock(mode="argument")
    command = ["EVALSHA", SCRIPTS.unindex.sha, 1, "k", "m", 1]
    assert clock.stamp(command) is command
    assert clock.script(SCRIPTS.ack) is SCRIPTS.ack


def test_a_refused_time_command_falls_back_to_the_wall_clock_with_an_unknown_bound() -> None:
    clock = ScriptClock(mode="argument", monotonic=Clock(7.0), wall=Clock(1234.5678))
    clock.sampled(ResponseError("unknown command 'TIME'"), sent=7.0, received=7.0)
    assert clock.bound is None
    assert clock.stamp(beat_command())[-1] == 1234567
    assert ScriptClock(mode="argument", time_command=None).due() is False


def test_refusals_are_told_from_other_errors() -> None:
    assert refuses_time(REFUSED)
    assert refuses_time(ResponseError("Unknown command called from script"))  # Valkey
    assert not refuses_time(ResponseError("unknown command 'TIME', with args beginning with: "))
    assert not refuses_time(ResponseError("WRONGTYPE Operation against a key"))


def test_every_timed_script_has_a_variant_reading_its_last_argument() -> None:
    for name in SCRIPTS.__slots__:
        script = getattr(SCRIPTS, name)
        # the default text reads TIME once (first), or never
        assert script.text.count("redis.call('TIME')") == (1 if script.timed else 0)
        if script.argument is not None:
            assert "redis.call('TIME')" not in script.argument.text
            assert "CLOCK_MS = tonumber(ARGV[#ARGV])" in script.argument.text


@pytest.mark.parametrize("mode", ["always", ""])
def test_bad_options_are_named(mode: str) -> None:
    with pytest.raises(ValueError, match="mode"):
        ScriptClock(mode=mode)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time_command"):
        ScriptClock(time_command="")


class _Job:
    """The part of a ticker's job ``settle_beats`` calls when ``index`` is empty."""

    class machine:  # stands in for a BeatMachine (the attributes settle_beats reads)
        index_shard = "ns:{#index:0}"
        job_id = "j"

    def __init__(self) -> None:
        self.failed: list[tuple[bool, bool]] = []

    def beat_failed(
        self, sent_at: float, exc: BaseException, *, quiet: bool, at_once: bool
    ) -> None:
        self.failed.append((quiet, at_once))


@pytest.mark.parametrize(("mode", "again"), [("auto", True), ("server", False)])
def test_a_beat_refused_time_is_sent_again_at_once_in_argument_time(mode: str, again: bool) -> None:
    clock = ScriptClock(mode=mode)  # type: ignore[arg-type]
    job = _Job()
    settled = settle_beats([[job]], [REFUSED], {}, 1.0, clock)  # type: ignore[list-item]
    assert job.failed == [(again, again)]
    assert clock.arguments is again
    assert settled.load == []
    # a NOSCRIPT in argument time loads the variant the clock sends
    settled = settle_beats([[_Job()]], [NoScriptError("x")], {}, 1.0, clock)  # type: ignore[list-item]
    assert settled.load == [clock.script(SCRIPTS.beat)]
