"""The Lua scripts, loaded once from ``lua/*.lua``, sent through the typed calls of ``calls.py``.

A script whose first line is ``--! include: NAME`` is assembled at import time with
``lua/NAME.lua`` prepended (Redis has no Lua include). The assembled text is what is loaded
into Redis, what ``SCRIPT LOAD`` receives after a NOSCRIPT, and what the tests exercise.
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


def _load(name: str) -> Script:
    folder = resources.files(__package__).joinpath("lua")
    text = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    first, _, _ = text.partition("\n")
    if first.startswith(_INCLUDE):
        lib = first.removeprefix(_INCLUDE).strip()
        text = folder.joinpath(f"{lib}.lua").read_text(encoding="utf-8") + "\n" + text
    return Script(name, text, hashlib.sha1(text.encode()).hexdigest())


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
