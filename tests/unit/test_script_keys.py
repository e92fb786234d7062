"""Every script declares its keys: each key a command touches is one of ``KEYS[n]``.

Dragonfly (and Redis Cluster, and any server that locks or routes by declared keys) runs a
script only against the keys passed in ``KEYS``; a key built inside the script, or taken from
``ARGV``, would be undeclared. Checked on the assembled text, which is what runs. A batch
(``beat.lua``) names a job's keys ``KEYS[k + n]``, ``k`` the count of the earlier jobs' keys
(2 to 4 each): declared keys all the same. That no path reads a key its beat did not send is
``tests/integration/test_beat_keys.py``'s (run on a cluster too).
"""

from __future__ import annotations

import re

import pytest

from jobpulse._protocol.scripts import SCRIPTS, Scripts

CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*(?:,\s*([^,)]+))?")
KEYLESS = {"TIME"}  # commands that take no key

NAMES = list(Scripts.__dataclass_fields__)


@pytest.mark.parametrize("name", NAMES)
def test_every_command_of_the_script_names_a_declared_key(name: str) -> None:
    text = getattr(SCRIPTS, name).text
    calls = CALL.findall(text)
    assert calls, f"{name}: no redis.call found (did the call syntax change?)"
    for command, first in calls:
        if command.upper() in KEYLESS:
            continue
        assert re.fullmatch(r"KEYS\[(k \+ )?\d+\]", first.strip()), (
            f"{name}: {command} on {first.strip()!r}, not a declared KEYS[n]"
        )


@pytest.mark.parametrize("name", NAMES)
def test_the_script_touches_no_key_through_a_variable(name: str) -> None:
    """Every call is a literal ``redis.call('CMD', ...)``: no command name or key assembled at
    run time that the check above could not see."""
    text = getattr(SCRIPTS, name).text
    assert text.count("redis.call(") + text.count("redis.pcall(") == len(CALL.findall(text))
