"""The one number check behind every option (worker, reader, sweeper, HTTP): pure."""

from __future__ import annotations

import math

__all__ = ["check_number", "check_seconds"]


def check_number(
    name: str,
    value: object,
    *,
    integer: bool = False,
    minimum: float | None = None,
    strict: bool = True,
    what: str | None = None,
) -> float:
    """Return ``value`` when it is a finite number (an int when ``integer``) above ``minimum``
    (``> minimum`` when ``strict``, else ``>= minimum``; None: any finite value), else raise.

    Raises:
        TypeError: not a number (a bool is not one), or not an int when ``integer``.
        ValueError: not finite, or out of range; the message names ``name``.
    """
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        noun = what or ("an int" if integer else "a number")
        raise TypeError(f"{name} must be {noun}, got {value!r}")
    assert isinstance(value, int | float)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return value


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a duration in seconds: a finite number ``>= 0`` (``> 0`` when ``positive``).

    Raises:
        TypeError: not a number.
        ValueError: not finite, or out of range; the message names ``name``.
    """
    return float(check_number(name, value, minimum=0, strict=positive, what="a number of seconds"))
