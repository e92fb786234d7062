"""The Lua scripts, loaded once from ``lua/*.lua``, sent through the typed calls of ``calls.py``.

A script whose first line is ``--! include: NAME ...`` is assembled at import time with
``lua/NAME.lua`` (each one named, in order) prepended (Redis has no Lua include). The assembled
text is what is loaded into Redis, what ``SCRIPT LOAD`` receives after a NOSCRIPT, and what the
tests exercise.

A script that reads the time includes ``_clock`` (the server's ``TIME``, read once, first). It
is assembled twice: its default text, and its *argument variant* (:attr:`Script.argument`) with
``_clock_arg`` in place of ``_clock``, whose time is the call's last argument, for servers that
refuse ``TIME`` in scripts (see ``clock.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["SCRIPTS", "Script", "Scripts", "evalsha"]

_INCLUDE = "--! include: "


@dataclass(frozen=True, slots=True)
class Script:
    """One assembled Lua script and its SHA1."""

    name: str
    text: str
    sha: str
    argument: Script | None = None  # the variant taking the time as its last argument

    @property
    def timed(self) -> bool:
        """True when the script reads the time (so it has an argument variant)."""
        return self.argument is not None


def _assemble(name: str, clock: str) -> str:
    folder = resources.files(__package__).joinpath("lua")
    text = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    first, _, _ = text.partition("\n")
    if first.startswith(_INCLUDE):
        libs = [clock if n == "_clock" else n for n in first.removeprefix(_INCLUDE).split()]
        parts = [folder.joinpath(f"{lib}.lua").read_text(encoding="utf-8") for lib in libs]
        text = "\n".join([*parts, text])
    return text


def _script(name: str, text: str, argument: Script | None = None) -> Script:
    return Script(name, text, hashlib.sha1(text.encode()).hexdigest(), argument)


def _load(name: str) -> Script:
    text = _assemble(name, "_clock")
    variant = _assemble(name, "_clock_arg")
    argument = _script(f"{name}@argument", variant) if variant != text else None
    return _script(name, text, argument)


@dataclass(frozen=True, slots=True)
class Scripts:
    """Every script jobpulse runs; immutable, shared by all clients."""

    acquire: Script
    beat: Script
    finish: Script
    cancel: Script
    claim: Script
    unindex: Script
    enroll: Script
    ack: Script
    tally: Script

    @classmethod
    def load(cls) -> Scripts:
        return cls(*(_load(n) for n in _NAMES))


_NAMES = ("acquire", "beat", "finish", "cancel", "claim", "unindex", "enroll", "ack", "tally")

SCRIPTS = Scripts.load()


async def evalsha(redis: Any, script: Script, keys: tuple[str, ...], args: list[Any]) -> Any:
    """Run ``script`` with an undecoded reply (tests and tools): ``calls.run`` underneath."""
    from .calls import Call, run

    return await run(redis, Call(script, keys, tuple(args), lambda reply: reply))
