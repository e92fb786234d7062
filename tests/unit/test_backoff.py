"""Backoff: the polling schedule (no Redis)."""

from __future__ import annotations

import itertools
import random

import pytest

from jobpulse import Backoff


def test_default_schedule_without_jitter_grows_to_the_cap() -> None:
    delays = list(itertools.islice(Backoff(jitter=0), 9))
    assert delays == pytest.approx([0.5, 0.75, 1.125, 1.6875, 2.53125, 3.796875, 5.0, 5.0, 5.0])


def test_jitter_stays_within_its_band_and_never_exceeds_the_cap() -> None:
    base = list(itertools.islice(Backoff(jitter=0), 50))
    jittered = list(itertools.islice(Backoff(rng=random.Random(7)), 50))
    for b, d in zip(base, jittered, strict=True):
        assert b * 0.9 <= d <= min(b * 1.1, 5.0)
    assert len(set(jittered)) > 10  # actually spread


def test_seeded_rng_gives_the_same_delays() -> None:
    a = list(itertools.islice(Backoff(rng=random.Random(1)), 20))
    b = list(itertools.islice(Backoff(rng=random.Random(1)), 20))
    assert a == b


def test_reset_starts_over() -> None:
    b = Backoff(jitter=0)
    next(b), next(b), next(b)
    b.reset()
    assert next(b) == 0.5


def test_is_an_iterator() -> None:
    b = Backoff()
    assert iter(b) is b


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"start": 0}, "start"),
        ({"start": -1}, "start"),
        ({"start": 2, "cap": 1}, "cap"),
        ({"factor": 0.5}, "factor"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"start": float("nan")}, "start"),
        ({"cap": float("inf")}, "cap"),
    ],
)
def test_invalid_arguments_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Backoff(**kwargs)


def test_non_numbers_are_refused() -> None:
    with pytest.raises(TypeError, match="start"):
        Backoff(start="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="jitter"):
        Backoff(jitter=True)
